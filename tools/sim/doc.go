// Package sim drives the real router (its policies, read-pool health and
// probe cadence) in virtual time against modeled members of a leader-based
// store, so that layouts the test bed cannot hold (five or seven members on
// a core each, regions tens of milliseconds apart, hours of load) run in
// seconds, the same for a seed. The router runs its rounds under
// router.Config.Manual: a first round at the start, then one at every
// ProbeInterval of virtual time (each client of a fleet at its own phase)
// and whenever it asks for one (Router.RoundPending).
//
// The model: each member is one CPU, a FIFO server of its jobs' costs
// (Costs), scaled by its cores, each job's time drawn log-normal about its
// cost when Costs.CV is set, and stalled now and then when its
// StallEvery is set. Each message crosses a link with the one-way delay of
// its zone pair ± uniform jitter (as the test bed's proxies shape it), and
// a degraded member's (Fault) more. Operations:
//   - a linearizable read at the leader costs it LeaderRead; at a follower,
//     the follower takes the read in turn, asks the leader for its read
//     index (ReadIndex of the leader's CPU) and then serves it
//     (FollowerRead). With Cluster.ConfirmReads (etcd's ReadIndex) the
//     leader first confirms its leadership with a round to a quorum of
//     followers, each answering in turn at no cost; without it (ZooKeeper's
//     sync, roughly) it does not;
//   - with Cluster.BatchReads (etcd's linearizable read loop) each member
//     asks for read indexes in batches: one request out at a time, for
//     the reads that came before it was sent, the leader's own reads
//     included; a request costs what one read's read index costs
//     unbatched, and each read is then served by its member (LeaderRead
//     or FollowerRead); a request unanswered for 500 ms is sent again,
//     the first answer to any sending counting, as etcd's loop does;
//   - a write at the leader costs it Write and commits once a quorum of
//     followers has appended it (Append of each follower's CPU: every
//     follower appends, the quorum's fastest acknowledgements commit); one
//     sent to a follower is forwarded (Forward of its CPU) and answered
//     through it.
//
// Clients (Workload.Clients) each have a router of their own and workers,
// closed-loop or paced (none: an idle fleet), each operation a read with probability
// ReadRatio, for a number of operations or a virtual duration; every read
// and write is placed by its client's router's Pick and reported by its
// Done when the simulated response arrives. Probes answer
// at once with the round trip a probe would take: the links both ways, a
// degraded member's delay and the member's CPU backlog (a stall
// included); a probe longer than the router's ProbeTimeout fails.
//
// Faults degrade a member, or kill it (a killed leader is replaced by an
// election) and restart it.
//
// Result.CPU is each member's CPU time over the measured window (each job
// counted when it is queued) and Result.ReadIndexes its read-index
// requests; Workload.PlacedOn places every operation on one member, as
// the test bed's costs scenario does.
//
// What it does not model: heartbeats and their CPU, batching of appends
// (and of read indexes without BatchReads), disks, retries and back-off, requests that wait for
// a new leader, leader moves other than by a kill, hedged reads (Run
// refuses them), and the probes' own cost.
package sim
