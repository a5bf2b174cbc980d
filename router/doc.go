// Package router decides, for each operation sent to a leader-based consensus
// store, which member should serve it. It knows nothing of etcd or ZooKeeper:
// a backend describes the members, supplies a Prober that asks a member who
// the leader is, classifies each call as an Op, and reports how it ended.
//
// The default policy, hybrid, sends writes to the leader (a follower would only
// forward them) and spreads linearizable reads over the healthy read pool (the
// leader only confirms its commit index; any member serves the read). A member
// whose read latency drifts far above the others leaves the read pool until it
// recovers. The other policies exist to compare against: round_robin (stock
// etcd), sticky (stock ZooKeeper), leader_only and boltzmann.
//
// # Shape
//
// Deciding and updating are separate, as in grpc-go's balancers. Pick reads an
// immutable snapshot through an atomic pointer and never blocks or allocates;
// a background loop probes the members every ProbeInterval, rebuilds the
// snapshot (leader, reachable members, read pool) and swaps it in. Feedback
// rides on the result: Pick returns a Pick whose Done method reports how the
// call ended, which feeds the latency estimators and the leader tracker.
//
// # Leader tracking
//
// Every member is probed concurrently every ProbeInterval. A leader-pinned
// write that fails clears the cached leader at once and triggers an immediate
// re-probe; while the leader is unknown, writes fall back to round robin and
// the server forwards them.
//
// # Concurrency
//
// A Router is safe for concurrent use. Pick and Pick.Done may be called from
// any number of goroutines.
//
// # Errors
//
// Constructors and Pick return errors that wrap the sentinels below, testable
// with errors.Is.
package router
