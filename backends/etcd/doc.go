// Package etcd is a drop-in etcd client (go.etcd.io/etcd/client/v3) whose
// RPCs are routed by what they ask of Raft, after "Operation-Type-Aware
// Client Routing for Leader-Based Consensus Datastores":
//
//   - Writes (Put, DeleteRange, Txn with a write, Compact, lease, member
//     and auth changes) go to the leader, which orders them; a follower
//     would only forward them.
//
//   - Linearizable reads (Range, read-only Txn, MemberList) are spread over
//     the healthy members: the server confirms the leader's commit index
//     (ReadIndex, a quorum round) and serves the read from its own state. A
//     member whose reads drift far above the others' (a grey failure),
//     that fails them, or whose status says it cannot serve them (no
//     leader, an older term, far behind the leader) leaves the read pool
//     until it recovers (package router).
//
//   - Serializable reads go to the healthy members, the client's zone
//     first (WithZones).
//
//   - Streams (Watch, lock and election calls, member-local maintenance)
//     are spread over the read pool and stick to their member; a Watch or
//     LeaseKeepAlive stream on a member that stops serving is moved, and
//     clientv3 resumes it (the watch by revision). LeaseKeepAlive goes to
//     the leader. A member that stops answering (frozen) is found from the
//     streams themselves, whatever the client's call rate: a watch stream
//     silent for 1.5 s asks for its progress (an answer the caller never
//     sees), a keep-alive must be answered within 500 ms, and a miss makes
//     the router probe at once; the streams move about 2.4 s after the
//     member's last message.
//
// New takes the same clientv3.Config as clientv3.New and returns a *Client
// that embeds *clientv3.Client, so KV, Txn, Watch, Lease, Cluster,
// Maintenance and Auth work unchanged; TLS, credentials and DialOptions
// apply to every connection, leader probes (Maintenance.Status on the
// client's own connections, every 250 ms) included. As clientv3.New
// (v3.7), New returns at once and the first calls find the members as they
// come up; WithConnectTimeout makes it wait until the leader is known.
// WithServiceConfig gives the connection the caller's gRPC method configs
// (timeouts, retry policies) beside the router's balancer.
//
//	cli, err := etcd.New(clientv3.Config{Endpoints: endpoints}, etcd.WithConnectTimeout(5*time.Second))
//	if err != nil {
//		return err
//	}
//	defer cli.Close()
//	_, err = cli.Put(ctx, "k", "v") // to the leader
//	resp, err := cli.Get(ctx, "k")  // spread over the healthy read pool
//
// Options: WithPolicy (router.Policies(); router.RoundRobin is stock
// clientv3's behaviour), WithConnsPerMember, WithZones, WithRouterConfig.
// Per call: WithLeader, WithMember, WithPreferredMember. Stats reports
// where operations went, the leader, and who is out of the read pool and
// why.
//
// Errors are etcd's and gRPC's, unchanged (rpctypes, status codes); the
// client's own are ErrNoEndpoints, ErrInvalidEndpoint, ErrUnreachable (New
// with WithConnectTimeout and no member answering) and the router's
// configuration errors. Writes are never retried by the router: a write
// whose connection broke may have been applied, as with clientv3.
//
// The member set starts as the Endpoints given to New and follows
// clientv3's own: SetEndpoints, Sync and AutoSyncInterval change it at run
// time (docs/membership.md).
package etcd
