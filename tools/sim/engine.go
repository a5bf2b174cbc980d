package sim

import (
	"cmp"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/oproute/oproute/router"
)

// Run runs w on cl with a router per client configured by cfg (its
// Members, Prober, Clock, Manual and Seed are the simulation's, and its
// ClientZone defaults to the cluster's; the rest is the caller's), the same
// for the same seed.
func Run(ctx context.Context, cfg router.Config, cl Cluster, w Workload, seed uint64) (Result, error) {
	if err := validate(cfg, cl, w); err != nil {
		return Result{}, err
	}
	s := newWorld(cl, seed)
	s.interval = cmp.Or(cfg.ProbeInterval, router.DefaultProbeInterval)
	s.probeTimeout = cmp.Or(cfg.ProbeTimeout, router.DefaultProbeTimeout)
	s.probes = make([]atomic.Uint64, len(cl.Members))
	cfg.Members = s.members()
	cfg.Prober = router.ProberFunc(s.probe)
	cfg.Clock = s
	cfg.Manual = true
	cfg.ClientZone = cmp.Or(cfg.ClientZone, cl.ClientZone)
	// The routers tell of their events from their rounds, which the run's
	// goroutine runs.
	var told []Event
	onEvent := cfg.OnEvent
	for c := range max(w.Clients, 1) {
		cfg := cfg
		cfg.Seed = cmp.Or(splitmix(seed+uint64(c)), 1)
		cfg.OnEvent = func(e router.Event) {
			told = append(told, Event{At: s.now, Client: c, Event: e})
			if onEvent != nil {
				onEvent(e)
			}
		}
		r, err := router.New(cfg)
		if err != nil {
			s.close()
			return Result{}, err
		}
		s.routers = append(s.routers, r)
	}
	defer s.close()
	res, err := s.run(ctx, w)
	res.Events = told
	return res, err
}

func (s *world) close() {
	for _, r := range s.routers {
		r.Close()
	}
}

// errRefused is a probe of a killed member.
var errRefused = errors.New("sim: connection refused")

// splitmix spreads a seed's bits, so that neighbouring seeds give the
// router unrelated choices.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// epoch is virtual time zero on the router's clock.
var epoch = time.Unix(1e9, 0)

// world is one run's state: virtual time, the event queue and the members'
// CPUs. One goroutine runs it; the router's concurrent probes, which run
// while that goroutine waits in Round, only read it (and count themselves,
// atomically).
type world struct {
	cl           Cluster
	routers      []*router.Router // one per client
	interval     time.Duration    // between the router's rounds
	probeTimeout time.Duration
	rnd          *rand.Rand
	now          time.Duration
	seq          uint64
	queue        events
	cpus         []cpu
	quorum       int // followers' acknowledgements a commit or a confirmation needs
	leader       int // -1 while a majority elects one
	term         uint64
	electAt      time.Duration // the pending election's time
	timeout      time.Duration // a worker's patience
	down         []bool        // killed members
	paths        [2][][]step   // under the current leader
	batches      []readBatch   // each member's read indexes (Cluster.BatchReads)
	ops          []operation   // each worker's
	workload     Workload
	ackCost      time.Duration   // an acknowledgement's job on the leader
	followers    []int           // every member but the leader
	probes       []atomic.Uint64 // answered or timed out, per member
	used         tally           // since the start

	// degraded is each member's fault now; faults the ones still to come.
	degraded []Fault
	faults   []Fault
}

// tally is what members did: CPU time and read-index requests, by index.
type tally struct {
	cpu      []time.Duration
	requests []int
}

func (t tally) clone() tally { return tally{slices.Clone(t.cpu), slices.Clone(t.requests)} }

// cpu is a member's FIFO server.
type cpu struct {
	cores    float64
	free     time.Duration // when the work queued so far ends
	stall    time.Duration // when its next stall begins (StallEvery set)
	stallEnd time.Duration // when the last stall begun ends
}

func newWorld(cl Cluster, seed uint64) *world {
	s := &world{cl: cl, rnd: rand.New(rand.NewPCG(seed, 0x5eed)), degraded: make([]Fault, len(cl.Members))}
	s.faults = slices.Clone(cl.Faults)
	slices.SortStableFunc(s.faults, func(a, b Fault) int { return cmp.Compare(a.At, b.At) })
	for _, m := range cl.Members {
		c := cpu{cores: cmp.Or(m.Cores, 1)}
		if m.StallEvery > 0 {
			c.stall = time.Duration(s.rnd.ExpFloat64() * float64(m.StallEvery))
		}
		s.cpus = append(s.cpus, c)
	}
	s.down = make([]bool, len(cl.Members))
	s.batches = make([]readBatch, len(cl.Members))
	s.used = tally{make([]time.Duration, len(cl.Members)), make([]int, len(cl.Members))}
	s.quorum = len(cl.Members) / 2 // with the leader, a majority
	s.leader = cl.Leader
	return s
}

// Now is the router's clock.
func (s *world) Now() time.Time { return epoch.Add(s.now) }

// setNow moves virtual time to t and applies the faults due by then.
func (s *world) setNow(t time.Duration) {
	s.now = t
	for len(s.faults) > 0 && s.faults[0].At <= t {
		f := s.faults[0]
		s.faults = s.faults[1:]
		switch {
		case f.Kill && !s.down[f.Member]:
			s.down[f.Member] = true
			s.cpus[f.Member].free = s.now // its queued work is lost
			s.resetBy(f.Member)
			s.killBatches(f.Member)
			if f.Member == s.leader {
				s.lead(-1)
				s.callElection()
			}
		case !f.Kill && s.down[f.Member]:
			s.down[f.Member] = false // back as a follower
			if s.leader < 0 {
				s.callElection()
			}
		}
		s.degraded[f.Member] = f
	}
}

// resetBy fails the operations that member i's death resets: those whose
// client's connection is to it, and those at a step it sends or serves.
func (s *world) resetBy(i int) {
	for k := range s.ops {
		o := &s.ops[k]
		if !o.live || o.path == nil {
			continue // not placed, or already failing
		}
		st := o.path[o.stage]
		if o.p.Index == i || st.src == i || st.kind == message && st.dst == i {
			t := s.now + s.hop(i, client)
			if o.p.Index != i { // the member the client called tells it
				t = s.now + s.hop(i, o.p.Index) + s.hop(o.p.Index, client)
			}
			s.fail(k, o, t, router.MemberFault)
		}
	}
}

// callElection schedules an election an election timeout from now, unless
// one is pending.
func (s *world) callElection() {
	if s.electAt > s.now {
		return
	}
	s.electAt = s.now + cmp.Or(s.cl.ElectionTimeout, time.Second)
	s.at(s.electAt, event{kind: election})
}

// elect makes the live member of the lowest index the leader, at a new
// term, if a majority is live.
func (s *world) elect() {
	if s.leader >= 0 || s.now != s.electAt {
		return // led, or a stale call
	}
	live := 0
	for _, d := range s.down {
		if !d {
			live++
		}
	}
	if live <= len(s.down)/2 {
		return // no majority: leaderless until a member comes back
	}
	s.lead(slices.Index(s.down, false))
}

// lead makes member i the leader (-1: none, an election under way) and
// rebuilds the paths and the followers for it.
func (s *world) lead(i int) {
	s.leader = i
	s.followers = s.followers[:0]
	if i < 0 {
		return
	}
	s.term++
	for f := range s.cl.Members {
		if f != i {
			s.followers = append(s.followers, f)
		}
	}
	s.paths = s.buildPaths(s.workload)
}

func (s *world) members() []router.Member {
	var ms []router.Member
	for _, m := range s.cl.Members {
		ms = append(ms, router.Member{ID: m.ID, Addr: m.ID, Zone: m.Zone})
	}
	return ms
}

// probe answers as the member would, with the round trip a probe would
// take now (no jitter drawn: probes run concurrently, and the draws are
// the run's), or fails as the router's probe times out.
func (s *world) probe(_ context.Context, m router.Member) (router.ProbeResult, error) {
	i := slices.IndexFunc(s.cl.Members, func(x Member) bool { return x.ID == m.ID })
	s.probes[i].Add(1)
	there, back := s.link(s.cl.ClientZone, s.zone(i)), s.link(s.zone(i), s.cl.ClientZone)
	c := s.cpus[i]
	rtt := there.Delay + back.Delay + 2*s.degraded[i].Delay + max(c.free-s.now, c.stallEnd-s.now, 0)
	switch {
	case s.down[i]:
		return router.ProbeResult{}, errRefused
	case rtt > s.probeTimeout:
		return router.ProbeResult{}, context.DeadlineExceeded
	case s.leader < 0:
		return router.ProbeResult{ServerID: m.ID, Leaderless: true, Term: s.term, RTT: max(rtt, time.Microsecond)}, nil
	}
	leader := s.cl.Members[s.leader].ID
	return router.ProbeResult{ServerID: m.ID, LeaderID: leader, Term: s.term, RTT: max(rtt, time.Microsecond)}, nil
}

func (s *world) link(a, b string) Link {
	if s.cl.Link == nil {
		return Link{}
	}
	return s.cl.Link(a, b)
}

// zone is where member i runs, or the client.
func (s *world) zone(i int) string {
	if i == client {
		return s.cl.ClientZone
	}
	return s.cl.Members[i].Zone
}

// hop is one message from src to dst (member indexes or client): the
// link between their zones, and a degraded end's delay.
func (s *world) hop(src, dst int) time.Duration {
	l := s.link(s.zone(src), s.zone(dst))
	d := l.Delay
	if l.Jitter > 0 {
		d += time.Duration((2*s.rnd.Float64() - 1) * float64(l.Jitter))
	}
	for _, i := range [2]int{src, dst} {
		if i == client || s.degraded[i].Delay == 0 {
			continue
		}
		f := s.degraded[i]
		d += f.Delay + time.Duration((2*s.rnd.Float64()-1)*float64(f.Jitter))
	}
	return d
}

// job queues cost on member i's CPU from now and returns when it ends.
func (s *world) job(i int, cost time.Duration) time.Duration {
	c, m := &s.cpus[i], s.cl.Members[i]
	t := float64(cost)
	if cv := s.cl.Costs.CV; cv > 0 && t > 0 {
		// Log-normal with mean cost: σ² = ln(1 + CV²).
		sigma := math.Sqrt(math.Log1p(cv * cv))
		t *= math.Exp(sigma*s.rnd.NormFloat64() - sigma*sigma/2)
	}
	s.used.cpu[i] += time.Duration(t)
	start := max(c.free, s.now)
	for m.StallEvery > 0 {
		// A stall begun by the time the job would start holds it (and
		// the jobs queued after it) back; the job in service when a
		// stall begins keeps its time.
		s.catchUp(i, start)
		if c.stallEnd <= start {
			break
		}
		start = c.stallEnd
	}
	c.free = start + time.Duration(t/c.cores)
	return c.free
}

// catchUp draws member i's stalls begun by t.
func (s *world) catchUp(i int, t time.Duration) {
	c, m := &s.cpus[i], s.cl.Members[i]
	for m.StallEvery > 0 && c.stall <= t {
		c.stallEnd = max(c.stallEnd, c.stall+m.StallFor)
		c.stall += time.Duration(s.rnd.ExpFloat64() * float64(m.StallEvery))
	}
}

// round runs client c's router's round at the current time, the members'
// stalls caught up first, so that a probe sees a stall on an idle member.
func (s *world) round(ctx context.Context, c int) error {
	for i := range s.cpus {
		s.catchUp(i, s.now)
	}
	return s.routers[c].Round(ctx)
}

func (s *world) run(ctx context.Context, w Workload) (Result, error) {
	s.workload, s.ackCost = w, s.cl.Costs.Message
	s.lead(s.cl.Leader)
	s.setNow(0) // faults at 0 apply to the first rounds and messages
	n := len(s.cl.Members)
	res := Result{Served: make([]int, n), ServedReads: make([]int, n)}
	clients := len(s.routers)
	// Each client's first round at the start, the next ones at its own
	// phase of the interval, so that a fleet's rounds do not all fall on
	// one instant.
	for c := range clients {
		if err := s.round(ctx, c); err != nil {
			return res, err
		}
		res.Rounds++
		s.at(s.interval+s.interval*time.Duration(c)/time.Duration(clients), event{worker: int32(c), kind: tick})
	}
	s.timeout = cmp.Or(w.Timeout, 5*time.Second)
	s.ops = make([]operation, w.Workers*clients)
	ops := s.ops
	started, completed, live := 0, 0, 0
	measuring := w.Warmup == 0 && w.WarmupTime == 0 || w.Workers == 0 // an idle fleet measures its probes only
	measureTo := w.Duration
	var measureFrom time.Duration
	var usedFrom, usedTo tally // at measureFrom, and at measureTo when it comes before the end
	more := func() bool { return (w.Ops == 0 || started < w.Ops) && (w.Duration == 0 || s.now < w.Duration) }
	// Paced workers each start an operation every period, on schedules
	// spread over it; one that overruns its slot starts the next at once,
	// with no burst to catch up.
	var period time.Duration
	if w.Rate > 0 {
		period = time.Duration(float64(len(ops)) / w.Rate * float64(time.Second))
		for k := range ops {
			ops[k].slot = period * time.Duration(k) / time.Duration(len(ops))
		}
	}
	pickCtx := ctx
	if w.PlacedOn != "" {
		pickCtx = router.WithMember(ctx, w.PlacedOn)
	}
	// place starts worker k's next operation, if any is left, or waits
	// for its slot (live counts the waits too).
	place := func(k int) error {
		if !more() {
			return nil
		}
		o := &ops[k]
		if o.slot > s.now {
			live++
			s.at(o.slot, event{worker: int32(k), kind: start})
			return nil
		}
		if period > 0 {
			o.slot = s.now + period
		}
		if started++; started == w.Ops {
			measureTo = s.now // from here on fewer workers are busy
			usedTo = s.used.clone()
		}
		o.op = router.Write
		if s.rnd.Float64() < w.ReadRatio {
			o.op = router.LinearizableRead
		}
		p, err := s.routers[k/w.Workers].Pick(pickCtx, o.op)
		if err != nil {
			return err
		}
		kind := 1
		if o.op.IsRead() {
			kind = 0
		}
		o.p, o.sent, o.stage, o.live, o.term, o.leader = p, s.now, 0, true, s.term, s.leader
		o.gen++
		o.id++
		live++
		if !o.armed { // one deadline event a worker at a time, re-armed as it fires
			o.armed = true
			s.at(s.now+s.timeout, event{worker: int32(k), kind: deadline, gen: o.id})
		}
		if s.leader < 0 || s.down[p.Index] {
			// Refused by a killed member, or no leader to serve it: the
			// error comes back after a round trip.
			s.fail(k, o, s.now+s.hop(client, p.Index)+s.hop(p.Index, client), router.MemberFault)
			return nil
		}
		o.path = s.paths[kind][p.Index]
		s.advance(k, o)
		return nil
	}
	for k := range ops {
		if err := place(k); err != nil {
			return res, err
		}
	}
	for live > 0 || w.Duration > 0 && more() {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		e := s.queue.pop() // never empty: every client's next tick is queued
		if w.Duration > 0 && e.at >= w.Duration {
			s.setNow(w.Duration)
			break // operations in flight at the end are left unfinished
		}
		s.setNow(e.at)
		if e.kind >= batchArrive {
			s.handleBatch(e) // moves reads on, ends none
			continue
		}
		c := int(e.worker) / max(w.Workers, 1) // the client whose router this event concerns
		if e.kind == tick {
			c = int(e.worker)
			if err := s.round(ctx, c); err != nil {
				return res, err
			}
			res.Rounds++
			s.at(s.now+s.interval, e)
		} else if e.kind == start {
			live--
			if err := place(int(e.worker)); err != nil {
				return res, err
			}
		} else if e.kind == election {
			s.elect()
		} else if k, o := int(e.worker), &ops[e.worker]; s.handle(e, k, o) {
			o.p.Done(o.outcome)
			o.live = false
			live--
			completed++
			if !measuring && completed >= w.Warmup && s.now >= w.WarmupTime {
				measuring, measureFrom = true, s.now
				usedFrom = s.used.clone()
			} else if measuring && more() && o.outcome != router.OK {
				res.Errors++
			} else if measuring && more() {
				res.Served[o.p.Index]++
				if o.op == router.Write {
					res.Writes = append(res.Writes, s.now-o.sent)
				} else {
					res.ServedReads[o.p.Index]++
					res.Reads = append(res.Reads, s.now-o.sent)
				}
			}
			if err := place(k); err != nil {
				return res, err
			}
		}
		if s.routers[c].RoundPending() { // the router asks for a round now
			if err := s.round(ctx, c); err != nil {
				return res, err
			}
			res.Rounds++
		}
	}
	if !measuring || measureFrom >= measureTo {
		return res, ErrShortRun
	}
	res.Elapsed = measureTo - measureFrom
	if usedTo.cpu == nil {
		usedTo = s.used
	}
	if usedFrom.cpu == nil { // measured from the start
		usedFrom = tally{make([]time.Duration, n), make([]int, n)}
	}
	for i := range n {
		res.CPU = append(res.CPU, usedTo.cpu[i]-usedFrom.cpu[i])
		res.ReadIndexes = append(res.ReadIndexes, usedTo.requests[i]-usedFrom.requests[i])
	}
	for i := range s.probes {
		res.Probes = append(res.Probes, s.probes[i].Load())
	}
	res.Stats = s.routers[0].Stats()
	return res, nil
}
