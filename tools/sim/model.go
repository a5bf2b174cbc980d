package sim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/oproute/oproute/router"
)

// Member is one modeled member.
type Member struct {
	ID    string
	Zone  string
	Cores float64 // CPU capacity; 0 means one core
	// Stalls pause the member's CPU (a garbage collection, a host's
	// hiccup): one begins on average every StallEvery (exponential
	// intervals) and lasts StallFor. 0: never.
	StallEvery, StallFor time.Duration
}

// Costs is the CPU each step of an operation takes on the member that does
// it, on one core.
type Costs struct {
	LeaderRead   time.Duration // a linearizable read served by the leader
	ReadIndex    time.Duration // the leader's part of a follower's read
	FollowerRead time.Duration // the follower's part of its read
	Write        time.Duration // the leader's part of a write
	Append       time.Duration // each follower's append of a write
	Forward      time.Duration // a follower forwarding a client's write
	PerKiB       time.Duration // serving a read, per KiB of its response; taking or appending a write, per KiB of its value
	// Message is what each message costs the member it reaches (its
	// sending included: a proxy's copy, a frame's decoding), and
	// MessagePerKiB more per KiB it carries.
	Message, MessagePerKiB time.Duration
	// CV is each job's coefficient of variation: its CPU time is drawn
	// log-normal about the step's cost (0: exactly the cost).
	CV float64
}

// Link is one direction of a zone pair.
type Link struct {
	Delay  time.Duration // one way
	Jitter time.Duration // ± this, uniform, per message (the test bed's shaping), at most Delay
}

// Cluster is the modeled store and where its client runs.
type Cluster struct {
	Members    []Member
	Leader     int
	Costs      Costs
	ClientZone string
	// ConfirmReads makes the leader confirm its leadership with a round
	// to a quorum before it answers a read index (etcd's ReadIndex).
	ConfirmReads bool
	// BatchReads has each member ask for read indexes in batches, as
	// etcd's linearizable read loop does: one request out at a time,
	// for the reads that came before it was sent (the leader's own
	// included); the reads that come meanwhile wait for the next one,
	// sent when its answer comes. A request costs what one read's read
	// index costs unbatched (ReadIndex at the leader, a Message for each
	// message of it and its confirmation); each read is then served
	// (LeaderRead or FollowerRead, and PerKiB). A request unanswered for
	// 500 ms is sent again (etcd's readIndexRetryTime), and the first
	// answer to any sending counts. A read placed on a follower under a
	// leader since replaced asks the new one.
	BatchReads bool
	// ElectionTimeout is how long after its leader is killed a majority
	// elects the live member of the lowest index. Default 1 s.
	ElectionTimeout time.Duration
	// Link returns the link from zone a to zone b (the client's zone
	// included); nil means no delay. It must be a pure function, safe
	// for concurrent use: the router's probes call it.
	Link func(a, b string) Link
	// Faults change members during the run, in the order of their At.
	Faults []Fault
}

// Fault changes member Member from At (virtual time from the run's start)
// on: with Kill, it is down (its process killed: messages to it are
// refused, its queued work is lost, and a leader killed is replaced after
// the election timeout); else every message to or from it takes Delay
// more, ± Jitter (uniform), as the test bed's Degrade does (0: healed). A
// Fault without Kill restarts a killed member, as a follower until an
// election, degraded by its Delay.
type Fault struct {
	At            time.Duration
	Member        int
	Delay, Jitter time.Duration
	Kill          bool
}

// Workload is the clients' load.
type Workload struct {
	// Clients each have a router of their own and Workers workers (0
	// means one client).
	Clients   int
	Workers   int     // workers per client; 0 for an idle fleet
	ReadRatio float64 // share of operations that are linearizable reads
	// Rate paces the workers to this many operations per virtual second
	// in all, each on a schedule of its own (one that overruns its slot
	// starts the next at once); 0 runs them closed-loop.
	Rate float64
	Ops  int // operations to place in all; 0: as many as Duration allows
	// ValueSize is the bytes of each value written and each key read (0:
	// sizes cost nothing); RangeSize the keys each read returns (0: 1).
	ValueSize, RangeSize int
	// Duration, when set, ends the run at that virtual time, operations in
	// flight left unfinished.
	Duration time.Duration
	Warmup   int // operations completed before measuring starts
	// Timeout is how long a worker waits for an operation before giving
	// up on it (a commit with no quorum alive, say). Default 5 s.
	Timeout time.Duration
	// WarmupTime, when set, also holds measuring back until that much
	// virtual time has passed (an idle fleet measures its probes over the
	// whole run).
	WarmupTime time.Duration
	// PlacedOn, when set, is the ID of the member every operation is
	// placed on (router.WithMember), as the test bed's costs scenario
	// places each class.
	PlacedOn string
}

// Result is what a run measured, from the end of its warm-up until its
// last operation was placed (the drain after it, with fewer workers busy,
// is left out).
type Result struct {
	Reads, Writes []time.Duration // latencies of the operations that succeeded
	Errors        int             // operations that failed or were given up on
	Served        []int           // operations each member was picked for and that succeeded, by index
	ServedReads   []int           // of which reads
	Elapsed       time.Duration   // virtual time measured
	Probes        []uint64        // probes each member answered or let time out, over the whole run
	Rounds        int             // router rounds run, over the whole run
	// CPU is each member's CPU time over the measured window, by index:
	// its jobs' times on one core, each counted when it was queued.
	CPU []time.Duration
	// ReadIndexes counts the read-index requests each member made over
	// the measured window, the leader's for its own reads and every
	// sending again included (Cluster.BatchReads; else none are counted).
	ReadIndexes []int
	Stats       router.Stats // the first client's router's view at the end
	Events      []Event      // the router's events, over the whole run
}

// Event is one of a router's events, when it came and whose router it was.
type Event struct {
	At     time.Duration // virtual time from the run's start
	Client int
	router.Event
}

// Throughput is the measured operations per virtual second.
func (r Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(len(r.Reads)+len(r.Writes)) / r.Elapsed.Seconds()
}

// Errors for input the simulator cannot run.
var (
	ErrNoMembers   = errors.New("sim: no members")
	ErrBadMember   = errors.New("sim: member out of range")
	ErrBadLoad     = errors.New("sim: workload needs operations or a duration (workers, or an idle fleet for a duration), and a read ratio in [0, 1]")
	ErrNegative    = errors.New("sim: negative cost, delay or capacity")
	ErrUnsupported = errors.New("sim: not modeled")
	// ErrShortRun: the run ended before its warm-up did.
	ErrShortRun = errors.New("sim: the run ended within its warm-up")
)

func validate(cfg router.Config, cl Cluster, w Workload) error {
	switch {
	case len(cl.Members) == 0:
		return ErrNoMembers
	case cl.Leader < 0 || cl.Leader >= len(cl.Members):
		return fmt.Errorf("%w: leader %d of %d", ErrBadMember, cl.Leader, len(cl.Members))
	case w.Timeout < 0 || cl.ElectionTimeout < 0:
		return fmt.Errorf("%w: timeouts", ErrNegative)
	case w.Clients < 0 || w.Workers < 0 || w.Ops < 0 || w.Duration < 0 || w.Ops == 0 && w.Duration == 0 ||
		w.Workers == 0 && w.Duration == 0 || w.Warmup < 0 || w.WarmupTime < 0 || w.ReadRatio < 0 || w.ReadRatio > 1 || w.Rate < 0 || w.Rate > 0 && w.Workers == 0 || w.ValueSize < 0 || w.RangeSize < 0:
		return fmt.Errorf("%w: %+v", ErrBadLoad, w)
	case w.Ops > 0 && w.Ops <= w.Warmup+w.Workers*max(w.Clients, 1):
		// The first operations are placed at once: none would be placed
		// after the warm-up.
		return fmt.Errorf("%w: %d operations for %d workers in all and a warm-up of %d", ErrBadLoad, w.Ops, w.Workers*max(w.Clients, 1), w.Warmup)
	case cfg.Hedge != nil || cfg.Policy == router.HybridHedge:
		return fmt.Errorf("%w: hedged reads (their timers run in wall time)", ErrUnsupported)
	}
	if w.PlacedOn != "" && !slices.ContainsFunc(cl.Members, func(m Member) bool { return m.ID == w.PlacedOn }) {
		return fmt.Errorf("%w: placed on %q, not a member", ErrBadMember, w.PlacedOn)
	}
	for _, f := range cl.Faults {
		if f.Member < 0 || f.Member >= len(cl.Members) {
			return fmt.Errorf("%w: fault on member %d of %d", ErrBadMember, f.Member, len(cl.Members))
		}
		if f.At < 0 || f.Delay < 0 || f.Jitter < 0 || f.Jitter > f.Delay {
			return fmt.Errorf("%w: %+v (jitter at most the delay)", ErrNegative, f)
		}
		if f.Kill && f.Delay > 0 {
			return fmt.Errorf("%w: a kill with a delay (%+v)", ErrBadMember, f)
		}
	}
	c := cl.Costs
	for _, d := range []time.Duration{c.LeaderRead, c.ReadIndex, c.FollowerRead, c.Write, c.Append, c.Forward, c.PerKiB, c.Message, c.MessagePerKiB} {
		if d < 0 {
			return fmt.Errorf("%w: costs %+v", ErrNegative, c)
		}
	}
	if c.CV < 0 {
		return fmt.Errorf("%w: CV %v", ErrNegative, c.CV)
	}
	zones := []string{cl.ClientZone}
	for _, m := range cl.Members {
		if m.Cores < 0 || m.StallEvery < 0 || m.StallFor < 0 {
			return fmt.Errorf("%w: member %+v", ErrNegative, m)
		}
		zones = append(zones, m.Zone)
	}
	if w.Workers > 0 && w.Ops == 0 {
		// Run until Duration only: an operation that takes no time would
		// never let it come.
		for _, m := range cl.Members {
			if cl.Link == nil || cl.Link(cl.ClientZone, m.Zone).Delay+cl.Link(m.Zone, cl.ClientZone).Delay <= 0 {
				return fmt.Errorf("%w: a run for a duration needs a client round trip to every member", ErrBadLoad)
			}
		}
	}
	if cl.Link != nil {
		for _, a := range zones {
			for _, b := range zones {
				if l := cl.Link(a, b); l.Delay < 0 || l.Jitter < 0 || l.Jitter > l.Delay {
					return fmt.Errorf("%w: link %s→%s %+v (jitter at most the delay)", ErrNegative, a, b, l)
				}
			}
		}
	}
	return nil
}
