// Package router decides, for each operation sent to a leader-based consensus
// store, which member should serve it. It knows nothing of etcd or ZooKeeper:
// a backend describes the members, supplies a Prober that asks a member who
// the leader is, classifies each call as an Op, and reports how it ended.
//
// The default policy, hybrid, sends writes to the leader (a follower would only
// forward them) and spreads linearizable reads over the healthy read pool (the
// leader only confirms its commit index; any member serves the read). A member
// whose read latency drifts far above the others leaves the read pool until it
// recovers. least_cost keeps hybrid's writes and read pool, and places each
// linearizable read where a model of each member's read cost, learned from
// the client's own reads, prices it lowest (readCost). The other policies
// exist to compare against: round_robin (stock etcd), sticky (stock
// ZooKeeper), leader_only and boltzmann.
//
// # Who uses what
//
// Applications reach the router through a backend (backends/etcd,
// backends/zk): they use its Config (through the backend's options), its
// Stats, the policy names, the error values and the context helpers
// through the backend's own (WithLeader, WithMember, WithPreferredMember,
// WithHedging: etcd's add what its streams need); they never hold a
// *Router.
// The *Router and its methods (Pick, Member, Refresh, SetMembers,
// WaitProbed, Round and the rest) are the API for a backend's author, who
// wires a store's client to it; what only the code that sends the
// operations tells the router or asks of it (a broken connection, a
// response's term, maintenance, where sessions and streams belong) is on
// its Backend view (Router.Backend).
//
// # Shape
//
// Deciding and updating are separate, as in grpc-go's balancers. Pick reads an
// immutable snapshot through an atomic pointer and never blocks or allocates;
// a background loop judges the members every ProbeInterval (probing them
// when a probe round is due: see Probe cadence), rebuilds the snapshot
// (leader, reachable members, read pool) and swaps it in. Feedback
// rides on the result: Pick returns a Pick whose Done method reports how the
// call ended as an Outcome — each backend maps every error it can see to one
// in one table — and the router alone decides what each outcome changes.
// What differs between policies is one value, chosen at New (policy in
// policies.go): where a pick goes, what an answer teaches it, and, for the
// two with a read pool, the latency rule that takes a member out of it
// (hybrid's medianRule, least_cost's baselineRule); the rest of the
// router is the same for all.
//
// # Read-pool health
//
// A member leaves the read pool on any of these, judged every round
// (Config names the parameters and gives their defaults):
//   - its probes say it cannot serve a linearizable read: no leader, a term
//     (epoch) older than the leader's, or an apply index more than MaxLag
//     behind the leader's commit index. It leaves at once, before a
//     read fails there, gets no reads at all, and returns when its probes
//     recover;
//   - latency, hybrid's rule (least_cost's is its baseline judge, below):
//     its read latency is above EjectRatio × the median of the
//     judged members' read latencies, its own included, and by more than
//     MinEjectGap, at EjectRounds rounds in a row (but for the rounds
//     held, below). A member's
//     read latency is the mean of the round's reads when it had MinSamples
//     of them, else its read EWMA (Alpha): at load one EWMA
//     reflects the last few reads only, and rounds that end on a healthy
//     member's tail would eject it. A round in which reads failed or
//     stalled on most members (an election, the whole cluster stalled) is no latency
//     evidence: every member is slow then, a far one most. A round
//     counts against a member only on the reads that ended in it: their
//     own mean must be above the line too (the EWMA remembers earlier
//     rounds' reads, which one round may not count again). A round with
//     none neither extends nor ends the run, for up to EjectRounds such
//     rounds in a row, after which the run ends (an idle client's
//     estimates stay as its last reads left them; judged again each idle
//     round, one slow read before a pause ejected a healthy member); nor
//     does a round on the edge, its reads and their mean above
//     ReadmitRatio × the median but short of EjectRatio ×, for up to
//     EjectRounds-1 of them in a run (a grey failure near the line dips
//     onto the edge when every member's reads slow together, on a noisy
//     host). Any other round not far above the line ends the run. Reads
//     the caller gave up on count as censored samples (the member took at
//     least that long) when they are that far above the median, so a member
//     slower than every caller's deadline is seen although it never
//     completes a read;
//   - failures: ConsecutiveFailures failed reads in a row while most
//     members had none within FailureWindow, or a failure
//     share over FailureWindow that exceeds the others' median share
//     by FailureShare;
//   - probe RTT: its probe EWMA (after 8 probes) above EjectRatio × the
//     members' median and by more than MinProbeEjectGap,
//     at EjectRounds probe rounds in a row: probes are few and share
//     connections with traffic, so they must say much more than reads.
//
// Distance is topology, not failure. A member in a farther zone reads slower
// for ever: its reads pay the distance twice (the client's link and its
// ReadIndex to the leader), and under load its EWMA sits at one and a half to
// two times the leader's, whose reads take no hop. The yardstick is therefore
// the median of all judged members: while at most a minority is unhealthy it
// is a healthy member's value, and a far member is compared with the other
// followers rather than with the mean of the leader and one follower (what
// the median of the others is with three members). The round's mean and the
// rounds in a row keep a healthy member's tail, which crosses any line now
// and then, from ejecting it; a grey failure (the paper's +8 ms on every link puts a
// follower's reads at five times the median) stays above the line.
//
// Under least_cost the latency rule is the baseline judge (readjudge.go):
// a member leaves while it is slower than its own baseline predicts, beyond
// what the others share, and returns, no sooner than its ejection time and
// with its probes in line, once its judge no longer finds it so, or after
// MaxEjection with its baseline forgotten (baselineRule).
//
// An ejected member keeps a ProbeShare of reads and, under hybrid, returns when
// ReadmitSamples of them in a row are in line with the pool's share-fair
// median (the median × pooled ÷ reachable members: while it is out the
// others carry its share, and on a saturated cluster their reads slow by
// that alone, while its own few reads meet an idle server) and its
// probes are in line with the others' (within ReadmitRatio × their median,
// or within MinProbeEjectGap: probes that could not have ejected it do not
// keep it out), and no sooner than its ejection time: BaseEjection,
// doubled for each ejection since it was last forgiven (MaxEjection
// in the pool), capped at MaxEjection.
//
// # Invariants
//
// The router keeps these on every path (probe rounds, Pick and Done, Backend.Busy,
// SetMembers, a failed leader-pinned write); a state-machine property test
// (statemachine_test.go, pgregory.net/rapid) checks them after every step of
// random sequences:
//   - at most a minority, ⌊(n−1)/2⌋ of the n reachable members, is out of the
//     read pool, ejected, benched and busy together: one function builds every
//     snapshot and applies the cap, keeping the most urgent out (busy first,
//     then benched, then the most severe ejections). A member whose probes
//     bench it beyond the cap stays in the read pool but holds no sessions
//     or streams and takes no leader-bound fallback (Backend.Serves is false);
//   - the read pool is never empty while a member is reachable, and a member
//     is reachable while any is not retired;
//   - a retired member is never picked (but by WithMember naming it) nor
//     the leader;
//   - a member whose reads and probes are in line with the others returns
//     within MaxEjection and a few probe rounds, also while the pool carries
//     the share of the members out of it; a member far out of line at equal
//     load stays out however much that share slows the pool
//     (TestDegradedStaysOutWhileOthersCarryItsShare), and the share-fair
//     median is never above the median;
//   - one index space: Pick.Index, Stats, Backend.Busy and Member use the roster's
//     stable indexes, which never move (members are added or retired);
//   - Pick never panics and, without overrides, never allocates;
//   - each pick is what its policy says (writes at the leader, or while it
//     is unknown a serving member; under a read pool, reads from the pool
//     or an ejected member's probe share and streams from the pool; sticky
//     on its member), checked against a model of each policy;
//   - least_cost's model and judge hold finite, non-negative numbers;
//   - a settled router (probing at StableProbeInterval) knows a leader and
//     has every live member reachable and in the read pool: any other state
//     probes every round.
//
// # Leader tracking
//
// A probe round asks every member concurrently who leads. A leader-pinned
// write that fails clears the cached leader at once and triggers an immediate
// re-probe; while the leader is unknown, writes fall back to round robin and
// the server forwards them.
//
// # Probe cadence
//
// A probe round runs every ProbeInterval until the router is
// settled: the leader known and unchanged, every member answering its
// probes and in the read pool, none failing, slow, busy or stalled (holding
// calls and finishing none for two rounds), for 8 probe
// rounds in a row. Settled, it probes every StableProbeInterval,
// jittered by ±20 % so that a fleet does not probe in step, and still
// judges reads every ProbeInterval. A settled round probes the leader
// (whose answer shows a leader change), every member picked for calls
// since its last probe, and the rest once in IdleProbeRounds settled
// rounds (never, if negative): an idle client then costs the cluster
// little more than one probe per interval. A member's probe verdicts (no
// leader, older term, lag) are judged only on an answer from the round at
// hand; one a settled round left out keeps its last. Evidence ends it at once, with a probe
// round at the next turn: a failed call, a read cut far above the median,
// a stalled member, a response at a newer term (Backend.ObserveTerm: etcd's
// response headers, a ZooKeeper write's zxid), a broken connection or lost
// session (Backend.Unsettle), a backend's own ping left unanswered
// (Backend.Unanswered: a frozen member holding an idle client's watch fails nothing, so the
// backends ask a silent stream or session for a sign of life; the miss
// counts as one failed probe), a membership change,
// maintenance, Refresh. An idle
// settled client notices a leader change within its stable interval; a
// client with traffic at once, from its calls. What only probes tell (a
// member without a leader, at an older term, or lagging) is seen at once
// when linearizable reads there hang or fail, and at the next stable probe
// after the client's first call there (within 12 s) when its calls go on
// being answered (stale reads only).
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
