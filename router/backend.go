package router

import (
	"slices"
	"time"
)

// Backend is the part of a Router that only the backend driving it calls:
// what the code that sends the operations alone can tell the router (a
// connection broke, a response's term, maintenance it started, a ping left
// unanswered), and what it needs to place sessions and streams. The
// Router's own methods (New, Pick, Stats, SetMembers, …) are the rest of a
// backend author's API; an application never holds either.
type Backend struct{ r *Router }

// Backend returns the calls for the backend that drives r.
func (r *Router) Backend() Backend { return Backend{r} }

// Unsettle tells the router of evidence that leadership or a member's
// health may have changed (a connection to a member broke, a session was
// lost): it probes at once, and at ProbeInterval until settled again.
func (b Backend) Unsettle() { b.r.unsettle() }

// Unanswered tells the router that member idx left a request of the
// backend's own unanswered (a ping on a silent watch stream or session): a
// frozen member fails nothing, it only stays silent. It counts as one
// failed probe, never alone enough to make the member unreachable, and the
// router probes at once: a member that fails that probe too is
// unreachable one probe timeout later (with the default UnreachableAfter,
// 2, instead of two); one that answers is back to no failures, and so is
// one whose probe in a round already under way succeeded. An index out of
// range or retired is ignored.
func (b Backend) Unanswered(idx int) { b.r.unanswered(idx) }

// ObserveTerm reports the leadership term (Raft term, ZAB epoch) that a
// response carried. A term newer than the probes have shown means the
// leader may have changed: the router probes at once (once per new term).
func (b Backend) ObserveTerm(term uint64) { b.r.observeTerm(term) }

// Busy marks member idx as busy with maintenance the client itself asked
// for (etcd's Defragment, during which the member serves nothing, and
// Snapshot, which streams its whole store): until
// the returned func is called the member takes no reads, and what its reads
// and probes show meanwhile is no evidence — a planned pause is not a grey
// failure, and it is not counted as an ejection. The func is idempotent.
func (b Backend) Busy(idx int) (end func()) { return b.r.markBusy(idx) }

// Home returns the member a client's long-lived, session-bound traffic
// belongs on (a ZooKeeper session that owns ephemerals): the sticky member
// under the sticky policy, otherwise the known leader, where that traffic's
// writes commit. ok is false when the leader is unknown.
func (b Backend) Home() (idx int, ok bool) { return b.r.policy.home(b.r.snap.Load()) }

// Serves reports whether member idx can hold long-lived streams: it is
// reachable and its probes show nothing that stops it serving (no leader,
// an older term, a large apply lag). A member ejected for slowness still
// serves; backends move streams only off members that do not.
func (b Backend) Serves(idx int) bool { return slices.Contains(b.r.snap.Load().serving, idx) }

// ProbeBudget is how long p, a probe-share read (one the router sends to an
// ejected member to see whether it has recovered) may take before it has
// shown that the member is still far out of line: twice the ejection
// threshold over the other members' median. It is 0 for every other pick,
// and while no median is known. A backend that can send the read elsewhere
// cuts it there, reports Done(CallerGaveUp) (censored evidence, enough to
// keep the member out) and tries the pool, so that a member still out of
// line costs the caller this delay, never a failed read.
func (b Backend) ProbeBudget(p Pick) time.Duration { return p.probeBudget() }
