package router

import (
	"fmt"
	"math"
	"time"

	"github.com/oproute/oproute/ewma"
)

// Policy names, one per policy. Hybrid is the default.
const (
	RoundRobin = "round_robin"
	LeaderOnly = "leader_only"
	Sticky     = "sticky"
	Boltzmann  = "boltzmann"
	Hybrid     = "hybrid"
	// LeastCost writes to the leader as Hybrid does and places each
	// linearizable read where a model of each member's read cost, learned
	// from the client's own reads, prices it lowest: its expected latency
	// plus what it adds to the reads queued behind it (see readCost).
	LeastCost = "least_cost"
)

// Hybrid's variants, each hybrid with one option on: every read hedged
// (Hedge with its defaults and Enabled, unless Hedge is set), or
// LoadAware. Config.Policy takes them; the router runs Hybrid.
const (
	HybridHedge = "hybrid+hedge"
	HybridP2C   = "hybrid+p2c"
)

// Policies lists every policy name, the default first.
func Policies() []string {
	return []string{Hybrid, RoundRobin, LeaderOnly, Sticky, Boltzmann, LeastCost}
}

// Config configures a Router. Zero fields take the documented defaults.
type Config struct {
	// Members of the cluster. Required; IDs and addresses must be unique.
	Members []Member
	// Prober asks a member who the leader is. Without one the leader stays
	// unknown and writes always fall back to round robin.
	Prober Prober
	// Policy is one of Policies(), or a variant of hybrid: HybridHedge or
	// HybridP2C. Default is Hybrid.
	Policy string

	// ProbeInterval is how often every member is probed while the router
	// is not settled, and how often reads are judged always; settled, the
	// members are probed at StableProbeInterval (idle ones rarer still:
	// IdleProbeRounds). Default is DefaultProbeInterval.
	ProbeInterval time.Duration
	// StableProbeInterval is how often the members are probed while the
	// router is settled: the leader known and unchanged, every member
	// answering and in the read pool, nothing failing or slow, for
	// 8 probe rounds in a row. Each wait is jittered by ±20 %
	// so that a fleet of clients does not probe in step. Evidence (a failed
	// or stalled call, a response at a newer term, a membership change,
	// Refresh) brings an immediate probe round and the ProbeInterval rate
	// back. Reads are judged every ProbeInterval either way. Default is
	// DefaultStableProbeInterval; a value at or below ProbeInterval probes
	// every ProbeInterval always.
	StableProbeInterval time.Duration
	// IdleProbeRounds is how often, in settled probe rounds, a member is
	// probed that is not the leader and took no calls since its last
	// probe: once in IdleProbeRounds rounds (the leader and the members in
	// use are probed at every settled round). Negative: never while
	// settled (its first call makes it a member in use; a backend whose
	// every probe is a new connection to the server, ZooKeeper's, saves
	// the most). Default is DefaultIdleProbeRounds.
	IdleProbeRounds int
	// ProbeTimeout bounds one probe. Default is 500 ms.
	ProbeTimeout time.Duration
	// UnreachableAfter is how many consecutive failed probes take a member
	// out of every rotation until a probe succeeds again. Default is 2.
	UnreachableAfter int

	// Alpha is the EWMA weight of the newest latency sample. Default is
	// ewma.DefaultAlpha (0.3, the paper's).
	Alpha float64
	// EjectRatio (ρ) ejects a member from the read pool when its read
	// latency (the round's mean at load, else its EWMA) exceeds ρ × the
	// median of the members' (its own included).
	// Default is 2.
	EjectRatio float64
	// ReadmitRatio is the line an ejected member must be back within to
	// return: ReadmitSamples of its probe-share reads in a row at most
	// ReadmitRatio × the share-fair read median (the median × pooled ÷
	// reachable members; or within MinEjectGap of the median), and its
	// probe EWMA at most ReadmitRatio × the others' (or within
	// MinProbeEjectGap); its read EWMA, which still holds the slow reads
	// that ejected it, is not consulted. Below EjectRatio so that a member
	// on the edge does not flap: neither back in on reads just under the
	// ejection line, nor kept in by them (a round of reads above
	// ReadmitRatio holds a latency run; see EjectRounds). Default is 0.9 ×
	// EjectRatio.
	ReadmitRatio float64
	// MinEjectGap is the least absolute excess over the median that ejects.
	// A member a few milliseconds farther away (another zone, whose reads
	// pay the distance twice: to the member and its ReadIndex to the
	// leader) is topology, not a grey failure, and keeps its share of reads;
	// ejection is for a member that drifts far above the rest. Default is
	// 5 ms; set a negative value for none.
	MinEjectGap time.Duration
	// MinProbeEjectGap is the least excess of a member's probe EWMA over the
	// members' median that ejects it (besides EjectRatio), with at least
	// MinProbeSamples probes. Probes come a few a second on connections
	// shared with traffic (a busy leader answers them later), far noisier
	// than reads, so they must say much more: a member whose probes take
	// 160 ms while the others' take 2 ms. Default is 4 × MinEjectGap.
	MinProbeEjectGap time.Duration
	// MinSamples is how many read samples a member needs before it is judged.
	// Default is 10.
	MinSamples int
	// EjectRounds is how many rounds in a row the latency rule (or probe
	// rounds in a row the probe-RTT rule) must hold before it ejects: a
	// healthy member's tail crosses any line now and then, while a grey
	// failure stays above it. The latency rule counts a round only on the
	// reads that ended in it; a round with none holds the run, for up to
	// EjectRounds such rounds in a row, and so does a round whose reads
	// (and their mean) are between ReadmitRatio and EjectRatio × the
	// median, up to EjectRounds-1 of them in a run; so with sparse reads
	// or near the line a run takes longer than EjectRounds intervals.
	// Default is 3 (at least 0.75 s at the default probe interval).
	EjectRounds int
	// ProbeShare is the fraction of reads an ejected member still receives,
	// so that its estimate can show a recovery. Default is 0.005.
	ProbeShare float64

	// ConsecutiveFailures ejects a member whose reads failed (MemberFault
	// or Overloaded) this many times in a row, as Envoy's consecutive_5xx.
	// Default is 5.
	ConsecutiveFailures int
	// FailureShare ejects a member whose share of failed reads over the
	// last FailureWindow exceeds the median share of the other members by
	// at least this much (with at least MinSamples reads in the window), as
	// Envoy's failure-percentage rule. Default is 0.3.
	FailureShare float64
	// FailureWindow is the span FailureShare is judged over. Default is 1 s.
	FailureWindow time.Duration
	// MaxLag takes a member out of the read pool while its applied index
	// is more than this many entries behind the leader's commit index
	// (when the prober reports them). Default is 1000.
	MaxLag uint64
	// BaseEjection is the least time an ejected member stays out. Each
	// ejection that follows the last readmission by less than MaxEjection
	// doubles it, up to MaxEjection (Envoy's base ejection time and its
	// multiplier). Default is 1 s.
	BaseEjection time.Duration
	// MaxEjection caps the ejection time; a member that stays in the pool
	// for this long is forgiven its past ejections. Default is 30 s.
	MaxEjection time.Duration
	// ReadmitSamples is how many of an ejected member's probe-share reads
	// in a row must be in line with the other members (ReadmitRatio) for it
	// to come back, besides its probes being in line: readmission needs
	// fresh evidence, never only the absence of bad news. Default is 3.
	ReadmitSamples int

	// LoadAware makes hybrid choose within the read pool by power of two
	// choices over each member's read EWMA × (its reads in flight + 1)
	// instead of round robin. The ejection and readmission rules are
	// hybrid's; a slow member is avoided from its first slow answers, so
	// the MinSamples that judge it come later than under round robin.
	LoadAware bool
	// Hedge, when set, configures hedged reads (hybrid only); see
	// HedgeConfig. Nil: no read is hedged.
	Hedge *HedgeConfig

	// Temperature (τ) of the boltzmann policy's softmax. Default is 1 ms.
	Temperature time.Duration
	// FailureThreshold: after more than this many consecutive failures a
	// member gets near-zero weight in boltzmann. Default is 3.
	FailureThreshold int
	// InitialLatency seeds the latency estimators before the first sample,
	// so that a cold start explores instead of stampeding. Default is 1 ms.
	InitialLatency time.Duration

	// ClientZone is the client's zone: stale reads prefer pool members there.
	ClientZone string
	// StickyMember is the member ID the sticky policy starts on. Default is
	// one chosen at random, as ZooKeeper's client shuffles its host list.
	StickyMember string

	// Clock tells the time. Default is the system clock.
	Clock Clock
	// Manual, when set, starts no background prober: the caller runs each
	// round with Round, at the times it chooses on the Clock it gave, as
	// a simulator in virtual time does (package sim). Refresh then marks
	// the next Round as forced (RoundPending), and WaitProbed waits, in
	// wall time, for Rounds another goroutine runs.
	Manual bool
	// Seed makes the router's random choices (boltzmann, probe share,
	// sticky start) repeatable, through one cursor shared by all callers.
	// Default is none: each thread draws from Go's own generator, with no
	// state shared between cores.
	Seed uint64

	// OnRefresh, when set, is called after every round, from the probing
	// goroutine (Round's, under Manual), once the new view (leader,
	// reachable members, read pool) is in place. Backends whose
	// connections are bound to a member (ZooKeeper sessions) use it to
	// move them. It must not block for long: the next round waits for it.
	OnRefresh func()

	// OnEvent, when set, is told of each routing change worth a log line
	// (leader changed or lost, a member unreachable or back, out of the
	// read pool or back, with the evidence): SlogEvents(logger) logs them.
	// The router calls it from its probing goroutine (Round's, under
	// Manual) with its lock held:
	// it must not block or call the router. Backends call it too, from
	// their own goroutines (ZooKeeper session events), so it must be safe
	// for concurrent use, as loggers are.
	OnEvent func(Event)
}

// DefaultProbeTimeout is Config.ProbeTimeout's default.
const DefaultProbeTimeout = 500 * time.Millisecond

// DefaultProbeInterval is Config.ProbeInterval's default.
const DefaultProbeInterval = 250 * time.Millisecond

// DefaultStableProbeInterval is Config.StableProbeInterval's default: with
// three members, while settled, 0.3 probes a second per client that uses
// every member, about 0.17 per idle client (DefaultIdleProbeRounds).
const DefaultStableProbeInterval = 10 * time.Second

// DefaultIdleProbeRounds is Config.IdleProbeRounds's default: an idle
// member is probed every third settled round (30 s).
const DefaultIdleProbeRounds = 3

func (c *Config) setDefaults() {
	switch c.Policy {
	case "":
		c.Policy = Hybrid
	case HybridHedge:
		c.Policy = Hybrid
		if c.Hedge == nil {
			c.Hedge = &HedgeConfig{Enabled: true}
		}
	case HybridP2C:
		c.Policy, c.LoadAware = Hybrid, true
	}
	orDefault(&c.ProbeInterval, DefaultProbeInterval)
	orDefault(&c.StableProbeInterval, DefaultStableProbeInterval)
	orDefault(&c.IdleProbeRounds, DefaultIdleProbeRounds)
	orDefault(&c.ProbeTimeout, DefaultProbeTimeout)
	orDefault(&c.UnreachableAfter, 2)
	orDefault(&c.Alpha, ewma.DefaultAlpha)
	orDefault(&c.EjectRatio, 2)
	orDefault(&c.ReadmitRatio, 0.9*c.EjectRatio)
	if c.MinEjectGap == 0 {
		c.MinEjectGap = 5 * time.Millisecond
	} else if c.MinEjectGap < 0 {
		c.MinEjectGap = 0
	}
	orDefault(&c.MinProbeEjectGap, 4*c.MinEjectGap)
	orDefault(&c.MinSamples, 10)
	orDefault(&c.EjectRounds, 3)
	orDefault(&c.ProbeShare, 0.005)
	orDefault(&c.ConsecutiveFailures, 5)
	orDefault(&c.FailureShare, 0.3)
	orDefault(&c.FailureWindow, time.Second)
	orDefault(&c.MaxLag, 1000)
	orDefault(&c.BaseEjection, time.Second)
	orDefault(&c.MaxEjection, 30*time.Second)
	orDefault(&c.ReadmitSamples, 3)
	orDefault(&c.Temperature, time.Millisecond)
	orDefault(&c.FailureThreshold, 3)
	orDefault(&c.InitialLatency, time.Millisecond)
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.Hedge != nil {
		h := *c.Hedge // the caller's struct stays as it was
		h.setDefaults()
		c.Hedge = &h
	}
}

func (c *Config) validate() error {
	if len(c.Members) == 0 {
		return ErrNoMembers
	}
	ids := make(map[string]bool, len(c.Members))
	addrs := make(map[string]bool, len(c.Members))
	for i, m := range c.Members {
		if m.ID == "" {
			return fmt.Errorf("%w: member %d has an empty ID", ErrInvalidConfig, i)
		}
		if ids[m.ID] {
			return fmt.Errorf("%w: ID %q", ErrDuplicateMember, m.ID)
		}
		ids[m.ID] = true
		if m.Addr != "" {
			if addrs[m.Addr] {
				return fmt.Errorf("%w: address %q", ErrDuplicateMember, m.Addr)
			}
			addrs[m.Addr] = true
		}
	}
	switch c.Policy {
	case RoundRobin, LeaderOnly, Sticky, Boltzmann, Hybrid, LeastCost:
	default:
		return fmt.Errorf("%w: %q (want one of %v)", ErrUnknownPolicy, c.Policy, Policies())
	}
	if c.Hedge != nil {
		if err := c.Hedge.validate(c.Policy); err != nil {
			return err
		}
	}
	if c.LoadAware && c.Policy != Hybrid {
		return fmt.Errorf("%w: load-aware choice needs the %s policy's read pool, not %s", ErrInvalidConfig, Hybrid, c.Policy)
	}
	if c.StickyMember != "" && !ids[c.StickyMember] {
		return fmt.Errorf("%w: sticky member %q", ErrUnknownMember, c.StickyMember)
	}
	type check struct {
		ok   bool
		what string
	}
	for _, ch := range []check{
		{c.ProbeInterval > 0, fmt.Sprintf("probe interval %v must be positive", c.ProbeInterval)},
		{c.StableProbeInterval > 0, fmt.Sprintf("stable probe interval %v must be positive", c.StableProbeInterval)},
		{c.ProbeTimeout > 0, fmt.Sprintf("probe timeout %v must be positive", c.ProbeTimeout)},
		{c.UnreachableAfter > 0, fmt.Sprintf("unreachable-after %d must be positive", c.UnreachableAfter)},
		{c.Alpha > 0 && c.Alpha <= 1, fmt.Sprintf("alpha %v outside (0, 1]", c.Alpha)},
		{c.EjectRatio > 1 && !math.IsInf(c.EjectRatio, 0), fmt.Sprintf("eject ratio %v must exceed 1", c.EjectRatio)},
		{c.ReadmitRatio > 0 && c.ReadmitRatio <= c.EjectRatio, fmt.Sprintf("readmit ratio %v outside (0, eject ratio %v]", c.ReadmitRatio, c.EjectRatio)},
		{c.MinSamples > 0, fmt.Sprintf("min samples %d must be positive", c.MinSamples)},
		{c.EjectRounds > 0, fmt.Sprintf("eject rounds %d must be positive", c.EjectRounds)},
		{c.ProbeShare > 0 && c.ProbeShare < 0.5, fmt.Sprintf("probe share %v outside (0, 0.5)", c.ProbeShare)},
		{c.ConsecutiveFailures > 0, fmt.Sprintf("consecutive failures %d must be positive", c.ConsecutiveFailures)},
		{c.FailureShare > 0 && c.FailureShare <= 1, fmt.Sprintf("failure share %v outside (0, 1]", c.FailureShare)},
		{c.FailureWindow > 0, fmt.Sprintf("failure window %v must be positive", c.FailureWindow)},
		{c.BaseEjection > 0 && c.MaxEjection >= c.BaseEjection, fmt.Sprintf("ejection times %v..%v: want 0 < base ≤ max", c.BaseEjection, c.MaxEjection)},
		{c.ReadmitSamples > 0, fmt.Sprintf("readmit samples %d must be positive", c.ReadmitSamples)},
		{c.Temperature > 0, fmt.Sprintf("temperature %v must be positive", c.Temperature)},
		{c.FailureThreshold > 0, fmt.Sprintf("failure threshold %d must be positive", c.FailureThreshold)},
		{c.InitialLatency > 0, fmt.Sprintf("initial latency %v must be positive", c.InitialLatency)},
	} {
		if !ch.ok {
			return fmt.Errorf("%w: %s", ErrInvalidConfig, ch.what)
		}
	}
	return nil
}

// orDefault sets *v to d when *v is its type's zero: how an option left
// unset takes its default.
func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}
