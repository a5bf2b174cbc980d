// Package kubernetes hands Kubernetes' storage layer a routed etcd client:
// a *kubernetes.Client of go.etcd.io/etcd/client/v3/kubernetes, the type
// k8s.io/apiserver's etcd3.New takes, whose RPCs the oproute etcd backend
// routes. The storage layer's creates, updates and deletes (Txns) go to
// the leader; its Gets and lists (Range) are linearizable reads, spread
// over the healthy members; its lists by RangeStream (Kubernetes 1.37 on)
// are routed as streams, spread like watches and left where they opened
// (one cut midway would fail its list); its watches move off a member that
// stops serving.
//
//	kc, err := kubernetes.New(clientv3.Config{Endpoints: endpoints})
//	if err != nil {
//		return err
//	}
//	defer kc.Close() // ends the router too
//	store, err := etcd3.New(kc, compactor, codec, newFunc, newListFunc, prefix, resourcePrefix, gr, transformer, leaseConfig, decoder, versioner)
//
// New takes the options of package backends/etcd (WithPolicy, WithZones,
// …) and fills the fields that kube-apiserver sets on its own client
// (newETCD3Client in k8s.io/apiserver/pkg/storage/storagebackend/factory)
// where the config leaves them zero:
//
//   - DialTimeout 20 s, and New waits as long until the leader is known
//     (or every member has answered; etcd.WithConnectTimeout, which opts
//     may change), as kube-apiserver waits for a ready connection before
//     it serves, so that the first write already goes to the leader; it
//     fails with etcd.ErrUnreachable when no member answers.
//   - DialKeepAliveTime 30 s and DialKeepAliveTimeout 10 s: gRPC pings that
//     find a dead member without waiting for TCP. They apply to every
//     pooled connection, one per member.
//
// The rest of kube-apiserver's client set-up is its own and stays with the
// caller: its gRPC Prometheus interceptors, the OpenTelemetry stats handler
// and an egress dialer go in Config.DialOptions (the router's interceptors
// chain after them), its shared zap logger in Config.Logger, TLS in
// Config.TLS. Message size limits stay clientv3's defaults, which
// kube-apiserver does not change either.
//
// Wrap turns a routed *etcd.Client into a *kubernetes.Client for a caller
// that wants the routed client itself as well: its Stats (where operations
// went, the leader, who left the read pool) and Collector (Prometheus).
// Both share one clientv3 client: closing either ends the router. The
// wrapper's Close returns at once, as etcd's kubernetes.Client.Close does,
// and the router's goroutines end just after; etcd.Client.Close waits for
// them. Either Close may report the client's own cancelled context
// (context.Canceled) after a clean close, as clientv3's does.
//
// This is a Go module of its own, so that the SDK takes no Kubernetes
// dependency. Its tests run Kubernetes' shared storage tests
// (k8s.io/apiserver/pkg/storage/testing) against etcd3.New on this client
// and on a 3-member test-bed cluster; README.md says how.
package kubernetes
