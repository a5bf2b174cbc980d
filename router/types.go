package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oproute/oproute/internal/override"
)

// Op is the class of an operation: what it asks of the consensus protocol.
type Op uint8

const (
	// Write is committed, or served, by the leader: a follower would forward it.
	Write Op = iota
	// LinearizableRead needs the leader to confirm its commit index (etcd
	// ReadIndex, ZooKeeper sync), after which any member serves it. On etcd
	// the confirmation is a quorum round (ReadIndex). On ZooKeeper, sync is
	// answered by the leader from its own state, not by a quorum
	// (ZOOKEEPER-1675): sync+read is linearizable while leadership is
	// stable, and a leader deposed while frozen can answer stale for a
	// moment after it resumes. The ZooKeeper backend's WithQuorumReads puts
	// a quorum operation in place of the sync.
	LinearizableRead
	// StaleRead is served from a member's local state with no coordination
	// (etcd serializable Range, ZooKeeper plain get).
	StaleRead
	// Stream is long-lived and served locally (etcd Watch, LeaseKeepAlive;
	// ZooKeeper watches). It is picked once, so it sticks to one member.
	Stream

	numOps = 4
)

var opNames = [numOps]string{"write", "linearizable_read", "stale_read", "stream"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", o)
}

// IsRead reports whether o is served by any member after at most a leader
// confirmation, so its latency speaks for the member's health as a reader.
func (o Op) IsRead() bool { return o == LinearizableRead || o == StaleRead }

// Outcome is how an operation ended, as far as routing cares. Each backend
// maps every error it can see to one Outcome in one table; the router alone
// decides what an Outcome changes (see Pick.Done).
type Outcome uint8

const (
	// OK: the member served the operation.
	OK Outcome = iota
	// AppError: the member served the operation and refused it on its
	// merits (a failed compare, a missing node, permission denied). For
	// routing it is a success: the member answered in its normal time.
	AppError
	// MemberFault: the member could not serve the operation: the transport
	// failed, the member is unavailable, has no leader, is not the leader
	// a write was pinned to, or timed out on its own side.
	MemberFault
	// Overloaded: the member refused for load (etcd "too many requests").
	// It counts against the member's reads but never clears the leader.
	Overloaded
	// CallerGaveUp: the caller's deadline passed or the caller cancelled.
	// A read cut after d is censored evidence that the member takes at
	// least d; it counts only when d is far above the other members'
	// latency, so that a caller's short deadline punishes nobody.
	CallerGaveUp
	// NotSent: the operation never left the client (no connection was
	// ready, the transport re-picked before sending). Not a sample, not a
	// success, not counted.
	NotSent

	numOutcomes = 6
)

var outcomeNames = [numOutcomes]string{"ok", "app_error", "member_fault", "overloaded", "caller_gave_up", "not_sent"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", o)
}

// Member is one server of the cluster.
type Member struct {
	// ID names the member for the router and its users; backends use the
	// endpoint as given by the user. It must be unique and non-empty.
	ID string
	// Addr is the network address the backend dials (host:port).
	Addr string
	// Zone is where the member runs. Stale reads prefer members in the
	// client's zone (Config.ClientZone). Optional.
	Zone string
}

// ProbeResult is what a member says about leadership.
type ProbeResult struct {
	// ServerID is the protocol's own identity of the member that answered
	// (etcd's member ID). It lets LeaderID be mapped back to a Member.
	ServerID string
	// LeaderID is the protocol identity of the leader this member follows,
	// "" when it knows none.
	LeaderID string
	// IsLeader is set when the member itself is the leader (ZooKeeper's
	// "Mode: leader"); backends that fill ServerID and LeaderID may leave it.
	IsLeader bool
	// Term is the leadership epoch (Raft term, ZAB epoch), 0 when the member
	// does not say. When members disagree about the leader, the highest term
	// wins, and a member reporting a term older than the leader's leaves the
	// read pool.
	Term uint64
	// NotServing marks a member that answered but must not receive traffic
	// (an etcd learner, a ZooKeeper server without quorum).
	NotServing bool
	// Leaderless marks a member that answered but follows no leader (etcd
	// Status.Leader == 0): its linearizable reads would hang until the
	// server gives up, so it leaves the read pool at once.
	Leaderless bool
	// Committed and Applied are the member's commit and apply indexes
	// (etcd RaftIndex, RaftAppliedIndex), 0 when unknown. A member that has
	// applied far less than the leader has committed (Config.MaxLag) serves
	// linearizable reads only after catching up, so it leaves the read pool.
	Committed, Applied uint64
	// RTT, when set, is the probe's round trip as the prober measured it,
	// which the router takes instead of timing Probe itself: a prober that
	// answers from a probe shared with other clients of the same server
	// returns that probe's result and round trip.
	RTT time.Duration
}

// Prober asks one member who the leader is. It must honour ctx's deadline;
// the router measures the round trip itself.
type Prober interface {
	Probe(ctx context.Context, m Member) (ProbeResult, error)
}

// ProberFunc adapts a function to Prober.
type ProberFunc func(ctx context.Context, m Member) (ProbeResult, error)

// Probe calls f.
func (f ProberFunc) Probe(ctx context.Context, m Member) (ProbeResult, error) { return f(ctx, m) }

// Clock tells the time. Inject a fake one to test policies deterministically.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Sentinel errors.
var (
	// ErrNoMembers: the configuration names no member.
	ErrNoMembers = errors.New("router: no members")
	// ErrDuplicateMember: two members share an ID or an address.
	ErrDuplicateMember = errors.New("router: duplicate member")
	// ErrInvalidConfig: a parameter is out of range.
	ErrInvalidConfig = errors.New("router: invalid configuration")
	// ErrUnknownPolicy: the policy name is not one of Policies().
	ErrUnknownPolicy = errors.New("router: unknown policy")
	// ErrUnknownMember: a per-call override names a member the router does not have.
	ErrUnknownMember = errors.New("router: unknown member")
	// ErrNotManual: Round was called on a router that probes in the
	// background (Config.Manual unset).
	ErrNotManual = errors.New("router: rounds run in the background (Config.Manual unset)")
	// ErrClosed: the router was closed.
	ErrClosed = errors.New("router: closed")
	// ErrUnreachable: no member answered (backends return it when a
	// connect timeout passes with nobody answering a probe).
	ErrUnreachable = errors.New("router: no member reachable")
)

// WithLeader returns a context whose operations go to the leader whatever
// their class (when the leader is unknown they fall back like writes do).
func WithLeader(ctx context.Context) context.Context {
	return override.With(ctx, override.Override{Leader: true})
}

// WithMember returns a context whose operations go to the member with the
// given ID, whatever the policy says. Pick fails with ErrUnknownMember if no
// such member exists.
func WithMember(ctx context.Context, id string) context.Context {
	return override.With(ctx, override.Override{Member: id})
}

// WithPreferredMember returns a context whose operations go to the member
// with the given ID while it is in the read pool, and where the policy says
// otherwise. A long-lived stream opened with it starts on that member and,
// when the member stops serving, resumes elsewhere. Pick fails with
// ErrUnknownMember if no such member exists.
func WithPreferredMember(ctx context.Context, id string) context.Context {
	return override.With(ctx, override.Override{Member: id, Prefer: true})
}
