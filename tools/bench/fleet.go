package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oproute/oproute/tools/testbed"

	"github.com/oproute/oproute/internal/testutil"
)

// What a fleet of clients costs the cluster: N clients in one process, each
// with a router of its own, idle or writing at a low paced rate; the
// members' own counts of the probes they answered and their CPU; then the
// leader killed, and for every client the time from the new leader to its
// first acknowledged write.

// FleetOptions configures one fleet run.
type FleetOptions struct {
	Policy  string        // a router policy, EveryRound or Stock
	Clients int           // clients in the fleet
	Window  time.Duration // how long the steady state is measured
	// Rate is each client's writes a second (0: idle). Writes are paced,
	// each on a key of the client's own.
	Rate float64
	// Failover kills the leader after the window (Rate must be > 0) and
	// measures each client's first acknowledged write after the new leader.
	Failover bool
	// Move moves leadership instead of killing the leader (etcd: a
	// transfer; ZooKeeper, which has none: leaders restarted until the
	// next member wins).
	Move bool
	// Settle is how long the clients run before the window opens: routers
	// settle (the router's settling probe rounds) and start-up probes pass.
	Settle time.Duration
	// Streams has each client hold long-lived streams for the whole run:
	// on etcd a watch and a lease's keep-alive (a 60 s lease, the default
	// of etcd's concurrency sessions), on ZooKeeper a watch.
	Streams bool
	// KeyPrefix is where the clients' keys go, the run's prefix
	// (Options.KeyPrefix), so that an attached cluster's cleanup removes
	// them; empty: DefaultKeyPrefix.
	KeyPrefix string
}

// streamHolder is a client that can hold the streams of FleetOptions.Streams.
type streamHolder interface {
	// HoldStreams opens them (key is the client's own); stop ends them.
	HoldStreams(ctx context.Context, key string) (stop func(), err error)
}

// FleetResult is one fleet run's figures.
type FleetResult struct {
	Policy  string  `json:"policy"`
	Clients int     `json:"clients"`
	Rate    float64 `json:"rate"`
	// ProbesPerClient is the probe requests (etcd Status RPCs; ZooKeeper
	// probe connections) the members answered per client and second over
	// the window, by the members' own counts.
	ProbesPerClient float64 `json:"probes_per_client_per_s"`
	MemberCPU       float64 `json:"member_cpu_cores"` // all members together
	ClientCPU       float64 `json:"client_cpu_cores"` // this process
	// Failover: per client, new leader → first acknowledged write.
	FirstWrite   []time.Duration `json:"first_write_after_new_leader,omitempty"`
	FailedWrites int             `json:"failed_writes"`
	// FailedBy counts the failed writes by cause (the client's ErrorClass).
	FailedBy    map[string]int `json:"failed_by,omitempty"`
	NewLeaderAt time.Duration  `json:"new_leader_after_kill,omitempty"`
	Moved       bool           `json:"leader_moved,omitempty"` // the leader moved rather than killed
	Streams     bool           `json:"streams,omitempty"`      // each client held streams
	// Failed says why the fleet could not be run in full (a client that
	// could not connect: the cluster overwhelmed), "" when it ran.
	Failed string `json:"failed,omitempty"`
}

// unsharedProbes on Connect's context asks for a client that shares no
// probes with the process's others (ZooKeeper Conns share by default).
type unsharedProbes struct{}

// probeCounter is a cluster that counts the probes its members answered.
type probeCounter interface {
	ProbeRequests(ctx context.Context) (uint64, error)
}

// ErrNoProbeCounts: the cluster cannot count the probes its members
// answer. etcd members count theirs (Status in /metrics); ZooKeeper
// servers count no four-letter words, so an attached ensemble cannot run
// a fleet: on the test bed its proxies count them.
var ErrNoProbeCounts = errors.New("bench: the cluster does not count the probes its members answer (a ZooKeeper ensemble's are counted by the test bed's proxies only)")

// RunFleet runs one fleet on cl.
func RunFleet(ctx context.Context, cl Cluster, o FleetOptions) (FleetResult, error) {
	res := FleetResult{Policy: o.Policy, Clients: o.Clients, Rate: o.Rate, Moved: o.Move, Streams: o.Streams}
	pc, ok := cl.(probeCounter)
	if !ok {
		return res, ErrNoProbeCounts
	}
	// Known before the clients connect, not after they settle.
	if _, err := pc.ProbeRequests(ctx); err != nil {
		return res, err
	}
	if o.Failover && o.Rate <= 0 {
		return res, errors.New("bench: a fleet failover needs writes (Rate > 0)")
	}
	// Each client's write key, then each one's stream key, under the run's
	// prefix.
	keys := keySpace(cmp.Or(o.KeyPrefix, DefaultKeyPrefix))
	clients := make([]Client, 0, o.Clients)
	defer func() {
		var wg sync.WaitGroup
		for _, c := range clients {
			wg.Go(func() { c.Close() })
		}
		wg.Wait()
	}()
	// A fleet is many processes: no two of its clients share probes.
	cctx := context.WithValue(ctx, unsharedProbes{}, true)
	for range o.Clients {
		c, err := cl.Connect(cctx, o.Policy, 1)
		if err != nil {
			// A result of its own: the fleet overwhelms the cluster.
			res.Failed = fmt.Sprintf("client %d of %d could not connect: %v", len(clients)+1, o.Clients, err)
			return res, nil
		}
		clients = append(clients, c)
		if o.Streams {
			sh, ok := c.(streamHolder)
			if !ok {
				return res, fmt.Errorf("bench: %s clients hold no streams", o.Policy)
			}
			stop, err := sh.HoldStreams(ctx, keys.key(o.Clients+len(clients)))
			if err != nil {
				res.Failed = fmt.Sprintf("client %d of %d could not open its streams: %v", len(clients), o.Clients, err)
				return res, nil
			}
			defer stop()
		}
	}

	// Writers: each client paced at Rate, its own key; acks and failures
	// recorded with their times.
	type ack struct {
		start, end time.Time
		err        error
	}
	logs := make([][]ack, len(clients))
	stop := make(chan struct{})
	var writers sync.WaitGroup
	if o.Rate > 0 {
		every := time.Duration(float64(time.Second) / o.Rate)
		for k, c := range clients {
			writers.Go(func() {
				key := keys.key(k)
				// Spread the clients' first writes over one period.
				t := time.NewTimer(time.Duration(k) * every / time.Duration(len(clients)))
				defer t.Stop()
				for n := 0; n < 1_000_000; n++ {
					select {
					case <-stop:
						return
					case <-ctx.Done():
						return
					case <-t.C:
					}
					t.Reset(every)
					wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					start := time.Now()
					err := c.Write(wctx, key, []byte("v"))
					cancel()
					logs[k] = append(logs[k], ack{start, time.Now(), err})
				}
			})
		}
	}
	endWriters := func() {
		close(stop)
		writers.Wait()
	}
	stopped := false
	defer func() {
		if !stopped {
			endWriters()
		}
	}()

	if err := sleepCtx(ctx, o.Settle); err != nil {
		return res, err
	}
	probes0, err := pc.ProbeRequests(ctx)
	if err != nil {
		return res, err
	}
	cpu0, client0, t0 := sum(cl.ServerCPU()), testutil.ProcessCPU(), time.Now()
	if err := sleepCtx(ctx, o.Window); err != nil {
		return res, err
	}
	probes1, err := pc.ProbeRequests(ctx)
	if err != nil {
		return res, err
	}
	span := time.Since(t0).Seconds()
	res.ProbesPerClient = float64(probes1-probes0) / span / float64(len(clients))
	res.MemberCPU = (sum(cl.ServerCPU()) - cpu0).Seconds() / span
	res.ClientCPU = (testutil.ProcessCPU() - client0).Seconds() / span

	if !o.Failover {
		return res, nil
	}
	f := cl.Faults()
	if f == nil {
		return res, ErrNeedsTestbed
	}
	old, err := cl.Leader(ctx)
	if err != nil {
		return res, err
	}
	killed := time.Now()
	down := false // the old leader killed and not restarted yet
	moved := make(chan error, 1)
	if o.Move {
		// To member 0, or 1 from 0: the member ZooKeeper elects after one
		// restart of the leader (by zxid, then by the test bed's
		// descending myids), so a move there is one election.
		to := 0
		if old == 0 {
			to = 1
		}
		go func() { moved <- f.MoveLeader(ctx, to) }()
	} else {
		if err := f.Kill(old); err != nil {
			return res, err
		}
		down = true
		moved <- nil
	}
	defer func() {
		if down {
			f.Restart(context.WithoutCancel(ctx), old)
		}
	}()
	var elected time.Time
	for deadline := killed.Add(60 * time.Second); ; {
		if i, err := cl.Leader(ctx); err == nil && i != old {
			elected = time.Now()
			break
		}
		if time.Now().After(deadline) {
			return res, errors.New("bench: no new leader 60 s after the kill")
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil { // polling the servers
			return res, err
		}
	}
	res.NewLeaderAt = elected.Sub(killed)
	if err := <-moved; err != nil && !errors.Is(err, testbed.ErrNoLeader) {
		// ZooKeeper has no transfer: the test bed restarts leaders until
		// the wanted member wins, and says so when another won. Any new
		// leader is a move for the fleet.
		return res, fmt.Errorf("bench: moving the leader: %w", err)
	}
	// Ten seconds of writes after the new leader: every client's first
	// acknowledged write falls in them, or it counts as none (-1).
	if err := sleepCtx(ctx, 10*time.Second); err != nil {
		return res, err
	}
	endWriters()
	stopped = true
	for k := range clients {
		first := time.Duration(-1)
		for _, a := range logs[k] {
			if a.start.After(killed) && a.err != nil {
				res.FailedWrites++
				if res.FailedBy == nil {
					res.FailedBy = map[string]int{}
				}
				res.FailedBy[errorClass(clients[k], a.err)]++
			}
			if first < 0 && a.err == nil && a.end.After(elected) {
				first = a.end.Sub(elected)
			}
		}
		res.FirstWrite = append(res.FirstWrite, first)
	}
	slices.Sort(res.FirstWrite)
	if !down {
		return res, nil
	}
	down = false
	return res, f.Restart(ctx, old)
}

// errorClasser is a client that names the cause of an error by its type.
type errorClasser interface {
	ErrorClass(err error) string
}

// errorClass names err's cause: the context's deadline, the client's
// ErrorClass, or "other".
func errorClass(c Client, err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	if ec, ok := c.(errorClasser); ok {
		if class := ec.ErrorClass(err); class != "" {
			return class
		}
	}
	return "other"
}

// streamsLabel names a fleet row's streams: "", ", streams held".
func streamsLabel(streams bool) string {
	if streams {
		return ", streams held"
	}
	return ""
}

// failoverLabel names a fleet row's failover: "", ", leader killed",
// ", leader moved".
func failoverLabel(failover, move bool) string {
	switch {
	case !failover:
		return ""
	case move:
		return ", leader moved"
	}
	return ", leader killed"
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// ScenarioFleet is the fleet scenario's name: not one of Scenarios(), since
// its figures are a fleet's cost, not a workload's latency.
const ScenarioFleet = "fleet"

// FleetCase is one row of the fleet scenario: a fleet size and load.
type FleetCase struct {
	Name     string // for --fleet-rows
	Clients  int
	Rate     float64 // writes a second per client; 0 idle
	Failover bool
	Move     bool // the leader moved, not killed
	Streams  bool // each client holds a watch (and, on etcd, a keep-alive)
}

// window is how long the row's steady state is measured: a full settled
// cycle (a settled round probes idle followers once in three, up to 36 s
// at the default stable interval and its jitter) for the steady rows, 10 s
// before the fault for the failover rows.
func (fc FleetCase) window() time.Duration {
	if fc.Failover {
		return 10 * time.Second
	}
	return 40 * time.Second
}

// DefaultFleetCases are the fleet scenario's rows: idle fleets of 100 and
// 500, 100 idle clients each holding streams, 100 clients writing once a
// second, and 50 clients writing twice a second through a leader kill and
// through a leader move.
func DefaultFleetCases() []FleetCase {
	return []FleetCase{
		{Name: "idle-100", Clients: 100},
		{Name: "idle-500", Clients: 500},
		{Name: "streams-100", Clients: 100, Streams: true},
		{Name: "writes-100", Clients: 100, Rate: 1},
		{Name: "failover-50", Clients: 50, Rate: 2, Failover: true},
		{Name: "move-50", Clients: 50, Rate: 2, Failover: true, Move: true},
	}
}

// FleetCasesNamed returns the default fleet rows with these names, in the
// default order; an unknown name is an error.
func FleetCasesNamed(names []string) ([]FleetCase, error) {
	all := DefaultFleetCases()
	var known []string
	for _, c := range all {
		known = append(known, c.Name)
	}
	for _, n := range names {
		if !slices.Contains(known, n) {
			return nil, fmt.Errorf("bench: unknown fleet row %q (known: %s)", n, strings.Join(known, ", "))
		}
	}
	return slices.DeleteFunc(all, func(c FleetCase) bool { return !slices.Contains(names, c.Name) }), nil
}

// FleetPolicies are the policies the fleet scenario compares on be: the
// stock client (clientv3; plain go-zookeeper), hybrid probing every round,
// hybrid with its adaptive cadence.
func FleetPolicies(be Backend) []string {
	return []string{Stock, EveryRound, "hybrid"}
}

// RunFleets runs every case for every policy, trials times each, the
// policies interleaved, on the runner's cluster (a failover kills its
// leader and restarts it).
func (r *Runner) RunFleets(ctx context.Context, cases []FleetCase, policies []string, trials int) ([]FleetResult, error) {
	be := r.opts.Backend
	var out []FleetResult
	if r.opts.Progress != nil {
		runs := len(cases) * len(policies) * trials
		var total time.Duration
		for _, fc := range cases {
			total += time.Duration(len(policies)*trials) * (5*time.Second + fc.window())
		}
		r.opts.Progress.Plan(runs, total)
	}
	for _, fc := range cases {
		for trial := range trials {
			for _, p := range policies {
				cl, err := r.cluster(ctx, be, 3)
				if err != nil {
					return out, err
				}
				label := fmt.Sprintf("fleet %s: %d clients, %.0f writes/s each%s%s, trial %d", p, fc.Clients, fc.Rate, streamsLabel(fc.Streams), failoverLabel(fc.Failover, fc.Move), trial+1)
				o := FleetOptions{Policy: p, Clients: fc.Clients, Window: fc.window(), Rate: fc.Rate, Failover: fc.Failover, Move: fc.Move, Streams: fc.Streams, Settle: 5 * time.Second, KeyPrefix: r.opts.KeyPrefix}
				if r.opts.Progress != nil {
					r.opts.Progress.Start(label, o.Settle+o.Window)
				}
				res, err := RunFleet(ctx, cl, o)
				if r.opts.Progress != nil {
					r.opts.Progress.Finish()
				}
				if err != nil {
					return out, fmt.Errorf("%s: %w", label, err)
				}
				out = append(out, res)
			}
		}
	}
	return out, nil
}

// FleetMarkdown renders fleet results: per case and policy the mean ± sd
// over trials.
func FleetMarkdown(results []FleetResult) string {
	type key struct {
		policy   string
		clients  int
		rate     float64
		failover bool
		moved    bool
		streams  bool
	}
	var order []key
	groups := map[key][]FleetResult{}
	for _, r := range results {
		k := key{r.Policy, r.Clients, r.Rate, r.FirstWrite != nil, r.Moved, r.Streams}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var b strings.Builder
	b.WriteString("| Fleet | Policy | Probes /client/s | Members' CPU (cores) | Client CPU (cores) | Failover: first write after new leader P50 / P99 / max (s) | Failed writes |\n|---|---|---|---|---|---|---|\n")
	for _, k := range order {
		g := groups[k]
		var probes, mcpu, ccpu, p50, p99, pmax, failed []float64
		never := 0
		causes := map[string]int{}
		for _, r := range g {
			probes = append(probes, r.ProbesPerClient)
			mcpu = append(mcpu, r.MemberCPU)
			ccpu = append(ccpu, r.ClientCPU)
			failed = append(failed, float64(r.FailedWrites))
			for c, n := range r.FailedBy {
				causes[c] += n
			}
			if r.FirstWrite != nil {
				var got []time.Duration
				for _, d := range r.FirstWrite {
					if d < 0 {
						never++
						continue
					}
					got = append(got, d)
				}
				if len(got) > 0 {
					p50 = append(p50, percentile(got, 50).Seconds())
					p99 = append(p99, percentile(got, 99).Seconds())
					pmax = append(pmax, got[len(got)-1].Seconds())
				}
			}
		}
		fleet := fmt.Sprintf("%d, %s", k.clients, map[bool]string{false: "idle", true: fmt.Sprintf("%.0f writes/s each", k.rate)}[k.rate > 0])
		fleet += streamsLabel(k.streams) + failoverLabel(k.failover, k.moved)
		fo, fw := "—", "—"
		if k.failover {
			fo = fmt.Sprintf("%s / %s / %s", pm(p50, 2), pm(p99, 2), pm(pmax, 2))
			if never > 0 {
				fo += fmt.Sprintf(" (%d clients none in 10 s)", never)
			}
			fw = pm(failed, 0)
			if len(causes) > 0 {
				var parts []string
				for _, c := range slices.Sorted(maps.Keys(causes)) {
					parts = append(parts, fmt.Sprintf("%s %d", c, causes[c]))
				}
				fw += fmt.Sprintf(" (all trials: %s)", strings.Join(parts, ", "))
			}
		}
		note := ""
		for _, r := range g {
			if r.Failed != "" {
				note = " (" + r.Failed + ")"
			}
		}
		if note != "" {
			fmt.Fprintf(&b, "| %s | %s | not run in full%s | | | | |\n", fleet, k.policy, note)
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", fleet, k.policy, pm(probes, 2), pm(mcpu, 3), pm(ccpu, 2), fo, fw)
	}
	return b.String()
}

// pm is mean ± sd over trials with d decimals, "—" for none.
func pm(xs []float64, d int) string {
	if len(xs) == 0 {
		return "—"
	}
	return Summarize(xs).Format(d)
}
