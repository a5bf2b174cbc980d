// Package testbed starts real consensus clusters on 127.0.0.1 with an
// emulated multi-zone network, for tests and benchmarks.
//
// etcd members run from go.etcd.io/etcd/server/v3/embed, each in its own
// process: the current executable re-executed with an environment variable
// that this package's init recognises. Separate processes give each member
// its own Prometheus registry (in one process the gRPC server metrics are
// shared, so every member's /metrics would show the same totals) and keep
// the client and the servers off one Go runtime. Any binary that imports
// testbed can therefore start a cluster: test binaries and routebench alike.
//
// Every client link and every peer link goes through a delay proxy (package
// testbed/proxy). The topology gives each member a zone and each pair of
// zones a one-way delay; the peer proxies tell senders apart by the
// X-Server-From header of etcd's raft connections, so each pair of members
// gets its own delay. Knobs add delay to one member's links (all of them, or
// its peer links only), blackhole them, partition a member from its peers
// while clients still reach it, make its client link reset connections,
// pause (SIGSTOP), kill (SIGKILL), restart a member, and move leadership.
// Both cluster types share the knobs, with the same names and meaning.
// The proxies also count the bytes they forward, and Traffic sorts them by
// whether they crossed zones, as a cloud bills them.
//
// ZooKeeper ensembles (StartZK) are real QuorumPeerMain JVMs from Debian's
// zookeeper package. Each server's proxies run in a process of their own
// (this binary re-executed). ZooKeeper's peer connections do not name their
// sender, so each server's zoo.cfg names, for every other server, the proxy
// of that one link: every ordered pair of servers gets its own delay on the
// quorum and election ports, as etcd's members do.
package testbed
