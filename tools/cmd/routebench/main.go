// Command routebench compares routing policies on a consensus store: by
// default a 3-member etcd cluster started on the test bed (zones a, a, b on
// loopback; each member, and the client, on a CPU budget of its own where
// cgroups can be written), the paper's healthy 80/20 comparison of stock
// clientv3, pinned, round_robin, hybrid and boltzmann, interleaved over 3 trials,
// printed as a table of mean ± sd with each policy's ratio to stock.
//
//	go run ./tools/cmd/routebench
//	go run ./tools/cmd/routebench --scenario all --out out/
//	go run ./tools/cmd/routebench --scenario fleet --backend zk
//	go run ./tools/cmd/routebench --member-cpu 0    # shared cores
//	go run ./tools/cmd/routebench --endpoints http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379
//	go run ./tools/cmd/routebench --endpoints https://10.0.0.1:2379,… --cacert ca.pem --user bench --password …
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/bench"
	"github.com/oproute/oproute/tools/sim"
	"github.com/oproute/oproute/tools/testbed"
)

// threeZones names testbed.ThreeZoneTopology for --topology.
const threeZones = "three-zones"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "routebench:", err)
		os.Exit(1)
	}
}

func run() error {
	w := bench.DefaultWorkload()
	fs := flag.NewFlagSet("routebench", flag.ContinueOnError)
	scenario := fs.String("scenario", bench.ScenarioQuick, "scenario(s), comma-separated (see below)")
	policies := fs.String("policies", "", "policies to compare, the first is the baseline (default: the scenario's); any of "+strings.Join(append(router.Policies(), bench.Comparators()...), ", "))
	trials := fs.Int("trials", 3, "trials per policy, interleaved")
	fs.DurationVar(&w.Duration, "duration", w.Duration, "measured time per trial (failover: 90s unless set)")
	fs.DurationVar(&w.Warmup, "warmup", w.Warmup, "warm-up per trial, discarded")
	fs.IntVar(&w.Workers, "workers", w.Workers, "workers (the paper used 128; see docs/routebench.md)")
	fs.Float64Var(&w.Rate, "rate", w.Rate, "operations per second in all, paced; 0: closed loop, as fast as the cluster answers")
	fs.Float64Var(&w.ReadRatio, "read-ratio", w.ReadRatio, "share of linearizable reads")
	fs.IntVar(&w.Keys, "keys", w.Keys, "key space")
	fs.IntVar(&w.ValueSize, "value-size", w.ValueSize, "bytes per written value")
	fs.IntVar(&w.RangeSize, "range-size", w.RangeSize, "keys per read")
	fs.IntVar(&w.ConnsPerMember, "conns", w.ConnsPerMember, "connections per member, the same for every policy")
	fs.Uint64Var(&w.Seed, "seed", w.Seed, "seed of the key choices")
	backend := fs.String("backend", "etcd", "store: etcd or zk (ZooKeeper from Debian's zookeeper package); the zk-* scenarios always run on zk")
	memberCPU := fs.String("member-cpu", auto, "cores each test-bed member may use (cgroup quota, its proxies included unless --proxies-apart), as if on its own machine: one value for all, or one per member (0.6,0.2,0.6); 0: shared cores; auto: the members share all but the client's part equally, where cgroups can be written (see docs/routebench.md)")
	proxiesApart := fs.Bool("proxies-apart", false, "run each test-bed member's proxies (the emulated network) outside its CPU budget, on the host's shared cores, as a kernel's network would be; their CPU is then measured apart (the costs scenario)")
	clientCPU := fs.String("client-cpu", auto, "cores the client process may use (cgroup quota) while members have budgets; 0: unconfined; auto: what the members' budgets leave of the host, at least 0.5")
	nodes := fs.Int("nodes", 3, "members, for scenarios without a fixed size (3 or 5)")
	topoFile := fs.String("topology", "", "three-zones (each member in a zone of its own: client and m0 in a, the leader m1 in b, m2 in c), or a JSON topology file (zones, one-way delays), replacing the default")
	simCosts := fs.String("sim-costs", "", "with --sim: costs.json files of costs runs (routebench --scenario costs --out DIR), comma-separated, one per store: each store's simulated members take costs fitted to its run instead of the placeholder costs")
	simulate := fs.Bool("sim", false, "simulate the cluster in virtual time on the real router (package sim; its costs are not calibrated yet: docs/simulator.md) instead of the test bed; scenarios with faults are refused")
	endpoints := fs.String("endpoints", "", "comma-separated endpoints of an existing cluster instead of the test bed (no fault injection; see docs/routebench.md, On your cluster)")
	var ext external
	fs.StringVar(&ext.cacert, "cacert", "", "with --endpoints: PEM file of the CA(s) that signed the servers' certificates; connect over TLS (ZooKeeper: to its secureClientPort)")
	fs.StringVar(&ext.cert, "cert", "", "with --endpoints: PEM file of a client certificate, for servers that ask for one (with --key); connect over TLS")
	fs.StringVar(&ext.key, "key", "", "with --endpoints: PEM file of --cert's private key")
	fs.StringVar(&ext.user, "user", "", "with --endpoints: authenticate every client as this user (etcd auth; ZooKeeper digest auth, user:password)")
	fs.StringVar(&ext.password, "password", "", "with --user: its password (default $"+passwordEnv+"); never written to results.json")
	fs.StringVar(&ext.zones, "zones", "", "with --endpoints and --client-zone: each endpoint's zone, endpoint=zone,…, as given to --endpoints: routed clients are told, as on the test bed")
	fs.StringVar(&ext.clientZone, "client-zone", "", "with --endpoints and --zones: the zone routebench runs in")
	fs.StringVar(&ext.prefix, "prefix", "", "with --endpoints: prefix of the keys the workload writes, ending in / (default routebench/<run id>/; ZooKeeper: znodes under /routebench/<run id>); refused if it already holds keys, unless --keep")
	fs.BoolVar(&ext.keep, "keep", false, "with --endpoints: leave the keys under --prefix; by default they are deleted when the run ends, fails or is interrupted")
	fleetRows := fs.String("fleet-rows", "", "fleet scenario rows, comma-separated (default all): idle-100, idle-500, streams-100, writes-100, failover-50, move-50")
	out := fs.String("out", "", "directory for tables.md, results.json, results.csv and PNG figures")
	cpuProfile := fs.String("cpuprofile", "", "write the client process's CPU profile here")
	resume := fs.Bool("resume", false, "with --out: take the cells DIR/results.json holds with every policy's trials, measured with the same workload, from there and run only the rest; for a grid cut short (not the fleet or costs scenario)")
	replot := fs.String("replot", "", "redraw DIR/tables.md and DIR's figures from DIR/results.json (a previous --out), running nothing")
	calibrate := fs.String("calibrate", "", "BED,SIM: the results.json of a test-bed run and of a simulated one (--sim); print their shared headline ratios side by side, running nothing")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: routebench [flags]\n\nScenarios:\n%s\nFlags:\n", bench.Describe())
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *replot != "" {
		return replotDir(*replot)
	}
	if *calibrate != "" {
		return calibrateFiles(*calibrate)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	started := time.Now()
	if *endpoints != "" {
		ext.endpoints = strings.Split(*endpoints, ",")
	}
	if ext.password == "" && ext.user != "" {
		ext.password = os.Getenv(passwordEnv)
	}
	attach, keyPrefix, err := ext.options(set, runID(started))
	if err != nil {
		return err
	}
	meta := bench.NewMeta(redacted(os.Args), *backend, w, started)

	names := strings.Split(*scenario, ",")
	if *simulate && (set["member-cpu"] || set["client-cpu"] || *endpoints != "" || *scenario == bench.ScenarioFleet || *scenario == bench.ScenarioCosts) {
		return fmt.Errorf("--sim simulates its cluster and clients: no --member-cpu, --client-cpu, --endpoints, fleet or costs scenario")
	}
	if *simCosts != "" && !*simulate {
		return errors.New("--sim-costs needs --sim")
	}
	setups, grid := setupsFor(names, set, setup{*topoFile, *memberCPU, *clientCPU, *simulate}, *endpoints != "")
	if grid {
		// Said at once: what the grid changes of what the user asked.
		if others := slices.DeleteFunc(slices.Clone(names), bench.SpansGrid); len(others) > 0 {
			logf("the dominance grid runs every layout and CPU mode in turn: %v run on each of them too", others)
		}
		if set["client-cpu"] {
			logf("--client-cpu applies to the grid's layouts on budgets; on shared cores the client runs unconfined")
		}
		if set["nodes"] {
			logf("--nodes applies to the default topology; three-zones has 3 members")
		}
	}
	base := bench.Options{Workload: w, Set: set, Trials: *trials, Nodes: *nodes, Logf: logf,
		Attach: attach, KeyPrefix: keyPrefix, KeepKeys: ext.keep,
		// Told by the runner between cells, in this goroutine: the files
		// written after each cell have the versions known by then.
		ServerVersions: func(store string, versions []string) {
			if meta.ServerVersions == nil {
				meta.ServerVersions = map[string][]string{}
			}
			meta.ServerVersions[store] = versions
		}}
	if *resume {
		if *out == "" {
			return errors.New("--resume needs --out, the directory of the run to resume")
		}
		path := filepath.Join(*out, "results.json")
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			logf("resume: no %s yet, so every cell runs", path)
		} else if base.Measured, err = bench.LoadComparisons(path); err != nil {
			return err
		} else {
			logf("resume: %d cells in %s; those measured with every policy's trials are not run again", len(base.Measured), path)
		}
	}
	if *policies != "" {
		base.Policies = strings.Split(*policies, ",")
	}
	if *endpoints != "" {
		base.Endpoints = ext.endpoints
		keys := "deleted after the run"
		if ext.keep {
			keys = "kept (--keep)"
		}
		logf("attaching to %v: no fault injection, no oracle; the workload's keys under %q, %s", base.Endpoints, keyPrefix, keys)
		meta.Endpoints, meta.KeysKept = base.Endpoints, ext.keep
	}
	meta.KeyPrefix = bench.DefaultKeyPrefix
	if keyPrefix != "" {
		meta.KeyPrefix = keyPrefix
	}
	// Every setup's options before the first cluster starts: a bad flag
	// fails at once, not hours into the grid.
	var runs []bench.Options
	for i, s := range setups {
		opts, err := s.options(base, *backend)
		if err != nil {
			return err
		}
		if *simCosts != "" {
			if opts.Backend, err = fittedSimBackend(strings.Split(*simCosts, ","), *backend); err != nil {
				return err
			}
		}
		if *proxiesApart {
			if s.simulated || len(opts.Endpoints) > 0 {
				return errors.New("--proxies-apart is for the test bed's members: no --sim or --endpoints")
			}
			opts.Backend = bench.WithProxiesApart(opts.Backend)
		}
		if grid && !s.simulated && s.memberCPU == auto && !bench.BudgetsOf(opts.Backend).Confined() {
			if i == 0 {
				logf("the grid runs on shared cores only: members cannot have budgets here")
			}
			continue
		}
		runs = append(runs, opts)
		if mode := bench.RunCPUMode(opts); !slices.Contains(meta.CPUModes, mode) {
			meta.CPUModes = append(meta.CPUModes, mode)
		}
	}

	ctx, stop := interruptible(logf)
	defer stop()
	if *scenario == bench.ScenarioFleet {
		opts := runs[0]
		opts.Progress = newProgress()
		r, err := bench.NewRunner(opts)
		if err != nil {
			return err
		}
		defer r.Close()
		return runFleet(ctx, r, opts, *out, *fleetRows)
	}
	if *scenario == bench.ScenarioCosts {
		opts := runs[0]
		if set["policies"] || set["nodes"] || opts.Topology != nil && len(opts.Topology.Zones) != 3 {
			return errors.New("the costs scenario runs on 3 members and no policy: no --policies, --nodes or topology of another size")
		}
		opts.Progress = newProgress()
		r, err := bench.NewRunner(opts)
		if err != nil {
			return err
		}
		defer r.Close()
		return runCosts(ctx, r, opts, *out)
	}
	var comps []*bench.Comparison
	var headers []string
	var errs []error
	// Every finished cell is written at once, with the cells of a resumed
	// run not reached yet, so that a run cut short keeps what it measured
	// and --resume goes on from there.
	var finished []*bench.Comparison
	var writeErr error
	keep := func(c *bench.Comparison) {
		finished = append(finished, c)
		if *out == "" || writeErr != nil {
			return
		}
		if writeErr = bench.WriteFiles(*out, withUnreached(finished, base.Measured), strings.Join(headers, "\n"), meta); writeErr != nil {
			logf("writing %s: %v", *out, writeErr)
		}
	}
	for i, opts := range runs {
		opts.Finished = keep
		if len(runs) > 1 {
			logf("layout and CPU mode %d of %d: %s topology, %s", i+1, len(runs), opts.TopologyName, bench.CPUModeName(bench.CPUMode(opts.Backend, opts.Nodes, opts.ClientCPU)))
		}
		header := headerText(opts, *scenario)
		headers = append(headers, header)
		fmt.Print(header)
		cs, err := runSetup(ctx, opts, names)
		comps = append(comps, cs...)
		if len(cs) > 0 {
			fmt.Println()
			fmt.Print(bench.Markdown(cs))
			if *out != "" {
				// The cells cut short too, for the record; --resume
				// runs them again.
				if werr := errors.Join(writeErr, bench.WriteFiles(*out, withUnreached(comps, base.Measured), strings.Join(headers, "\n"), meta)); werr != nil {
					return werr
				}
				logf("wrote %s/{tables.md,results.json,results.csv,*.png}", *out)
			}
		}
		if err != nil {
			if ctx.Err() != nil || len(runs) == 1 {
				return errors.Join(append(errs, err)...)
			}
			// One layout's failure (a cluster that would not start, an
			// election that would not settle) must not cost the grid the
			// others: said now, returned at the end.
			logf("layout and CPU mode %d of %d failed, going on with the next: %v", i+1, len(runs), err)
			errs = append(errs, fmt.Errorf("%s topology, %s: %w", opts.TopologyName, bench.CPUModeName(bench.CPUMode(opts.Backend, opts.Nodes, opts.ClientCPU)), err))
		}
	}
	if len(runs) > 1 {
		if d := bench.DominanceMarkdown(comps); d != "" {
			fmt.Print("\nEvery layout and CPU mode:\n\n" + d)
		}
	}
	return errors.Join(errs...)
}

// withUnreached is cs and the cells of measured that none of cs replaces:
// what a resumed run has not reached yet stays on record.
func withUnreached(cs, measured []*bench.Comparison) []*bench.Comparison {
	type key struct{ scenario, variant, topology, cpu string }
	have := map[key]bool{}
	for _, c := range cs {
		have[key{c.Scenario, c.Variant, c.Topology, c.CPU}] = true
	}
	out := slices.Clone(cs)
	for _, c := range measured {
		if !have[key{c.Scenario, c.Variant, c.Topology, c.CPU}] {
			out = append(out, c)
		}
	}
	return out
}

// setup is a layout and CPU mode to run scenarios on: --topology,
// --member-cpu and --client-cpu.
type setup struct {
	topology, memberCPU, clientCPU string
	simulated                      bool // --sim: no CPU modes
}

// setupsFor is where the scenarios run: the dominance grid on every
// layout (the default topology, three zones) and CPU mode (budgets,
// shared cores) in turn, unless the user picked one with --topology or
// --member-cpu; anything else on the one the flags say (flags). grid
// says which.
func setupsFor(names []string, set map[string]bool, flags setup, external bool) (setups []setup, grid bool) {
	if set["topology"] || set["member-cpu"] || external || !slices.ContainsFunc(names, bench.SpansGrid) {
		return []setup{flags}, false
	}
	if flags.simulated { // one CPU model: the layouts only
		return []setup{{"", flags.memberCPU, flags.clientCPU, true}, {threeZones, flags.memberCPU, flags.clientCPU, true}}, true
	}
	// --client-cpu is for the budgets: on shared cores the client runs
	// unconfined.
	return []setup{{"", auto, flags.clientCPU, false}, {"", "0", auto, false}, {threeZones, auto, flags.clientCPU, false}, {threeZones, "0", auto, false}}, true
}

// options completes base for s: the topology, the CPU budgets and the
// backend on them.
func (s setup) options(base bench.Options, backend string) (bench.Options, error) {
	opts := base
	switch s.topology {
	case "":
		if len(opts.Endpoints) == 0 {
			opts.TopologyName = "default"
		}
	case threeZones:
		topo := testbed.ThreeZoneTopology()
		opts.Topology, opts.TopologyName = &topo, threeZones
	default:
		topo, err := testbed.LoadTopology(s.topology)
		if err != nil {
			return opts, err
		}
		opts.Topology, opts.TopologyName = &topo, strings.TrimSuffix(filepath.Base(s.topology), filepath.Ext(s.topology))
	}
	if s.simulated {
		if len(opts.Endpoints) > 0 {
			return opts, fmt.Errorf("--sim simulates its cluster: no --endpoints")
		}
		switch backend {
		case "etcd", "zk":
			var err error
			opts.Backend, err = bench.SimBackend(bench.SimCosts(), backend)
			return opts, err
		}
		return opts, fmt.Errorf("unknown backend %q (want etcd or zk)", backend)
	}
	size := opts.Nodes // scenarios of a fixed size say their own budgets in their tables
	if opts.Topology != nil {
		size = len(opts.Topology.Zones)
	}
	budgets, client, err := cpuBudgets(s.memberCPU, s.clientCPU, size, len(opts.Endpoints) > 0)
	if err != nil {
		return opts, err
	}
	opts.ClientCPU = client
	switch backend {
	case "etcd":
		opts.Backend = bench.Etcd{CPUBudgets: budgets}
	case "zk":
		opts.Backend = bench.ZooKeeper{CPUBudgets: budgets}
	default:
		return opts, fmt.Errorf("unknown backend %q (want etcd or zk)", backend)
	}
	return opts, nil
}

// runSetup runs the scenarios on a runner of its own, closed (its
// clusters stopped, the client released) before it returns.
func runSetup(ctx context.Context, opts bench.Options, names []string) ([]*bench.Comparison, error) {
	p := newProgress()
	opts.Progress = p
	r, err := bench.NewRunner(opts)
	if err != nil {
		return nil, err
	}
	comps, err := r.Run(ctx, names...)
	p.close()
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	return comps, err
}

func headerText(opts bench.Options, scenario string) string {
	w := opts.Workload
	var b strings.Builder
	backend := opts.Backend.Name()
	if strings.Contains(scenario, "zk-") || scenario == bench.ScenarioAll {
		backend += " (zk-* scenarios: zk)"
	}
	fmt.Fprintf(&b, "routebench: backend %s, scenario %s, %d trial(s) per policy, interleaved (the defaults below; a scenario's own trials, pacing and connections, which its tables state, win over those you did not set)\n", backend, scenario, opts.Trials)
	pacing := "closed-loop"
	if w.Rate > 0 {
		pacing = fmt.Sprintf("paced (%.0f ops/s in all)", w.Rate)
	}
	fmt.Fprintf(&b, "workload: %.0f%% reads, %d keys, %d-byte values, %d key(s) per read, %d %s workers (default %d closed-loop: two cores saturate near 16), %v measured after %v warm-up, %d connections per member\n",
		100*w.ReadRatio, w.Keys, w.ValueSize, w.RangeSize, w.Workers, pacing, bench.DefaultWorkers, w.Duration, w.Warmup, w.ConnsPerMember)
	if len(opts.Endpoints) > 0 {
		var how []string
		if opts.Attach.TLS != nil {
			how = append(how, "over TLS")
		}
		if u := opts.Attach.Username; u != "" {
			how = append(how, "as user "+u)
		}
		if z := opts.Attach.ClientZone; z != "" {
			how = append(how, fmt.Sprintf("client in zone %s, zones %v", z, opts.Attach.Zones))
		}
		keys := "deleted after the run"
		if opts.KeepKeys {
			keys = "kept"
		}
		fmt.Fprintf(&b, "cluster: external %v%s; the workload's keys under %q, %s\n", opts.Endpoints, strings.TrimSuffix(" "+strings.Join(how, ", "), " "), opts.KeyPrefix, keys)
	} else {
		topo := testbed.DefaultTopology(opts.Nodes)
		if opts.Topology != nil {
			topo = *opts.Topology
		}
		leader := "whoever wins the election"
		if topo.Leader >= 0 {
			leader = fmt.Sprintf("m%d (zone %s), moved back before every trial", topo.Leader, topo.Zones[topo.Leader])
		}
		if opts.Backend.Name() == "sim" {
			fmt.Fprintf(&b, "cluster: simulated in virtual time on the real router (docs/simulator.md), zones %v, client in zone %s, one-way %v in a zone and %v across (±%.0f%% jitter), peer links alike; leader m%d\n",
				topo.Zones, topo.ClientZone, time.Duration(topo.SameZone), time.Duration(topo.CrossZone), 100*topo.Jitter, max(topo.Leader, 0))
			fmt.Fprintf(&b, "%s\n", bench.CPUMode(opts.Backend, opts.Nodes, opts.ClientCPU))
			return b.String()
		}
		fmt.Fprintf(&b, "cluster: test bed on 127.0.0.1, zones %v, client in zone %s, one-way %v in a zone and %v across (±%.0f%% jitter), peer links shaped alike; each member its own process; leader %s\n",
			topo.Zones, topo.ClientZone, time.Duration(topo.SameZone), time.Duration(topo.CrossZone), 100*topo.Jitter, leader)
	}
	fmt.Fprintf(&b, "machine: %d CPUs, %s; latencies are service times (see bench docs)\n", runtime.NumCPU(), runtime.Version())
	if len(opts.Endpoints) == 0 {
		fmt.Fprintf(&b, "%s\n", bench.CPUMode(opts.Backend, opts.Nodes, opts.ClientCPU))
	}
	return b.String()
}

// auto is the default of --member-cpu and --client-cpu.
const auto = "auto"

// passwordEnv holds --password when the flag is not given: a password on
// the command line is visible to every user of the host.
const passwordEnv = "ROUTEBENCH_PASSWORD"

// external is what the flags say of a cluster of one's own: where it is
// (--endpoints), how to reach it and place it, and where the run's keys go.
type external struct {
	endpoints         []string
	cacert, cert, key string
	user, password    string
	zones, clientZone string
	prefix            string
	keep              bool
}

// externalOnly are the flags for a cluster of one's own, refused without
// --endpoints.
var externalOnly = []string{"cacert", "cert", "key", "user", "password", "zones", "client-zone", "prefix", "keep"}

// errExternalOnly: a flag for a cluster of one's own without --endpoints.
var errExternalOnly = errors.New("for a cluster of your own: they need --endpoints")

// options checks the flags that go with --endpoints (set names those
// given) and reads them: the TLS files, the credentials, the zones, and
// the key prefix, by default one of the run's own (runID).
func (e external) options(set map[string]bool, runID string) (bench.AttachOptions, string, error) {
	var o bench.AttachOptions
	if len(e.endpoints) == 0 {
		var given []string
		for _, f := range externalOnly {
			if set[f] {
				given = append(given, "--"+f)
			}
		}
		if len(given) > 0 {
			return o, "", fmt.Errorf("%s: %w", strings.Join(given, ", "), errExternalOnly)
		}
		return o, "", nil
	}
	switch {
	case (e.cert == "") != (e.key == ""):
		return o, "", errors.New("--cert and --key go together")
	case e.user == "" && e.password != "":
		return o, "", errors.New("--password needs --user")
	case e.user != "" && e.password == "":
		return o, "", fmt.Errorf("--user %s needs a password: --password or $%s", e.user, passwordEnv)
	case (e.zones == "") != (e.clientZone == ""):
		return o, "", errors.New("--zones and --client-zone go together")
	}
	var err error
	if o.TLS, err = loadTLS(e.cacert, e.cert, e.key); err != nil {
		return o, "", err
	}
	if o.TLS != nil {
		// clientv3 connects an http:// endpoint in plaintext whatever
		// Config.TLS says (and would send the password so).
		for _, ep := range e.endpoints {
			if strings.HasPrefix(ep, "http://") || strings.HasPrefix(ep, "unix://") {
				return o, "", fmt.Errorf("--cacert/--cert with %s: a plaintext endpoint; give https:// (unixs://) endpoints", ep)
			}
		}
	}
	o.Username, o.Password, o.ClientZone = e.user, e.password, e.clientZone
	if e.zones != "" {
		if o.Zones, err = parseZones(e.zones, e.endpoints); err != nil {
			return o, "", err
		}
	}
	prefix := e.prefix
	if prefix == "" {
		prefix = "routebench/" + runID + "/"
	}
	if err := bench.ValidKeyPrefix(prefix); err != nil {
		return o, "", fmt.Errorf("--prefix: %w", err)
	}
	return o, prefix, nil
}

// loadTLS reads the clients' TLS configuration from PEM files: the CAs to
// trust (the host's when cacert is empty) and, with certFile, the client
// certificate and its key; nil when neither file is given.
func loadTLS(cacert, certFile, keyFile string) (*tls.Config, error) {
	if cacert == "" && certFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cacert != "" {
		pem, err := os.ReadFile(cacert)
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--cacert %s: no PEM certificate in it", cacert)
		}
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert %s, --key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// parseZones reads --zones, endpoint=zone,…: every endpoint once, as given
// to --endpoints, and nothing else.
func parseZones(s string, endpoints []string) (map[string]string, error) {
	zones := map[string]string{}
	for _, part := range strings.Split(s, ",") {
		// The endpoint may be a URL; its zone follows the last "=".
		i := strings.LastIndexByte(part, '=')
		if i <= 0 || i == len(part)-1 {
			return nil, fmt.Errorf("--zones %q: want endpoint=zone,…", s)
		}
		ep, zone := strings.TrimSpace(part[:i]), strings.TrimSpace(part[i+1:])
		if !slices.Contains(endpoints, ep) {
			return nil, fmt.Errorf("--zones: %s is not one of --endpoints %v", ep, endpoints)
		}
		if _, dup := zones[ep]; dup {
			return nil, fmt.Errorf("--zones: %s twice", ep)
		}
		zones[ep] = zone
	}
	for _, ep := range endpoints {
		if zones[ep] == "" {
			return nil, fmt.Errorf("--zones: no zone for %s", ep)
		}
	}
	return zones, nil
}

// runID names a run: when it started, and a random part for runs started
// in the same second.
func runID(started time.Time) string {
	return fmt.Sprintf("%s-%06x", started.UTC().Format("20060102T150405Z"), rand.Uint32()&0xffffff)
}

// redacted is the command line with --password's value replaced, for
// results.json.
func redacted(args []string) []string {
	out := slices.Clone(args)
	for i := 0; i < len(out); i++ {
		name, _, hasValue := strings.Cut(strings.TrimLeft(out[i], "-"), "=")
		if !strings.HasPrefix(out[i], "-") || name != "password" {
			continue
		}
		if hasValue {
			out[i] = out[i][:strings.IndexByte(out[i], '=')+1] + "REDACTED"
		} else if i+1 < len(out) {
			out[i+1] = "REDACTED"
			i++
		}
	}
	return out
}

// cpuBudgets reads --member-cpu and --client-cpu. auto gives members
// bench.DefaultBudgets where the test bed can confine processes and
// shared cores, said in a remark, where it cannot; an automatic client
// budget is what the members' budgets leave of the host.
func cpuBudgets(member, client string, nodes int, external bool) (testbed.CPUBudgets, float64, error) {
	var b testbed.CPUBudgets
	if external {
		if member != auto || client != auto {
			return b, 0, fmt.Errorf("--member-cpu and --client-cpu are for the test bed, not --endpoints")
		}
		return b, 0, nil
	}
	clientAuto := client == auto
	var clientCores float64
	if !clientAuto {
		v, err := strconv.ParseFloat(client, 64)
		if err != nil || !(v == 0 || v >= 0.1 && v <= 1024) {
			return b, 0, fmt.Errorf("--client-cpu %q: want cores from 0.1, e.g. 0.5, or 0 for unconfined", client)
		}
		clientCores = v
	}
	if member == auto {
		if err := testbed.CPULimitAvailable(); err != nil {
			if clientCores > 0 {
				return b, 0, fmt.Errorf("--client-cpu %s: %w", client, err)
			}
			logf("shared cores: the test bed cannot give members CPU budgets here (%v); --member-cpu 0 says so quietly", err)
			return b, 0, nil
		}
		var def float64
		b, def = bench.DefaultBudgets(runtime.NumCPU())
		if clientAuto {
			clientCores = def
		}
	} else {
		cpus, err := parseCores(member)
		if err != nil {
			return b, 0, err
		}
		if len(cpus) == 1 {
			b.MemberCPU = cpus[0]
		} else {
			b.MemberCPUs = cpus
		}
		if b.Confined() && clientAuto {
			left := float64(runtime.NumCPU())
			for i := range nodes {
				left -= b.Of(i, nodes)
			}
			if clientCores = max(bench.MinClientCPU, left); left < bench.MinClientCPU {
				logf("the members' budgets leave the client %.3g of %d CPUs: it gets %.3g and the host is overcommitted", left, runtime.NumCPU(), clientCores)
			}
		}
	}
	if clientCores > 0 && !b.Confined() {
		return b, 0, fmt.Errorf("--client-cpu %s needs members on budgets (--member-cpu): unconfined members would share the client's", client)
	}
	return b, clientCores, nil
}

// parseCores reads --member-cpu: one value, or one per member.
func parseCores(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v == 0 || v >= 0.1 && v <= 64) { // the test bed's minimum quota is 0.1
			return nil, fmt.Errorf("--member-cpu %q: want cores per member, e.g. 0.4 or 0.6,0.2,0.6", s)
		}
		out = append(out, v)
	}
	return out, nil
}

// calibrateFiles prints the headline ratios a test-bed run and a
// simulated one share ("BED,SIM", each a results.json) side by side.
func calibrateFiles(paths string) error {
	bedPath, simPath, ok := strings.Cut(paths, ",")
	if !ok {
		return fmt.Errorf("--calibrate %q: want BED,SIM", paths)
	}
	bed, err := bench.LoadComparisons(bedPath)
	if err != nil {
		return err
	}
	sim, err := bench.LoadComparisons(simPath)
	if err != nil {
		return err
	}
	rows := bench.Calibrate(bed, sim)
	if len(rows) == 0 {
		return fmt.Errorf("%s and %s share no scenario, variant and topology in which both ran a policy and its reference", bedPath, simPath)
	}
	fmt.Print(bench.CalibrationMarkdown(rows))
	return nil
}

// replotDir redraws a previous --out directory from its results.json,
// keeping the header its tables.md had and the meta its results.json had.
func replotDir(dir string) error {
	comps, meta, err := bench.LoadRun(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	header := ""
	if old, err := os.ReadFile(filepath.Join(dir, "tables.md")); err == nil {
		if i := strings.Index(string(old), "\n#### "); i >= 0 {
			header = string(old[:i])
		}
	}
	return bench.WriteFiles(dir, comps, header, meta)
}

// runFleet runs the fleet scenario: what a fleet of clients costs the
// cluster, stock against the router probing every round and settled.
func runFleet(ctx context.Context, r *bench.Runner, opts bench.Options, out, rows string) error {
	policies := opts.Policies
	if policies == nil {
		policies = bench.FleetPolicies(opts.Backend)
	}
	trials := 3
	if opts.Set["trials"] {
		trials = opts.Trials
	}
	cases := bench.DefaultFleetCases()
	if rows != "" {
		var err error
		if cases, err = bench.FleetCasesNamed(strings.Split(rows, ",")); err != nil {
			return err
		}
	}
	fmt.Printf("routebench: fleet on %s (3 members), policies %v, %d trial(s) interleaved; after 5 s to settle, 40 s windows (a full settled probe cycle), 10 s before a failover\n", opts.Backend.Name(), policies, trials)
	res, err := r.RunFleets(ctx, cases, policies, trials)
	opts.Progress.(*progress).close()
	table := bench.FleetMarkdown(res)
	if len(opts.Endpoints) == 0 {
		table += "\n" + bench.CPUMode(opts.Backend, 3, opts.ClientCPU) + "\n"
	}
	fmt.Println()
	fmt.Print(table)
	if out != "" && len(res) > 0 {
		if err := os.MkdirAll(out, 0o755); err != nil {
			return err
		}
		if werr := os.WriteFile(filepath.Join(out, "fleet.md"), []byte(table), 0o644); werr != nil {
			return werr
		}
		logf("wrote %s/fleet.md", out)
	}
	return err
}

// fittedSimBackend is store simulated with each store's costs fitted to
// its costs report among paths (costs runs' costs.json, one per store).
func fittedSimBackend(paths []string, store string) (bench.Backend, error) {
	costs := map[string]sim.Costs{}
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var rep bench.CostReport
		if err := json.Unmarshal(raw, &rep); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if _, dup := costs[rep.Backend]; dup {
			return nil, fmt.Errorf("%s: a second costs run of %s", path, rep.Backend)
		}
		fit, err := bench.SimCostsFrom(rep, rep.Backend)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		logf("simulated %s costs fitted to %s: %+v", rep.Backend, path, fit.Costs)
		costs[rep.Backend] = fit.Costs
	}
	return bench.SimBackendOf(costs, store)
}

// runCosts runs the costs scenario: what each operation class costs the
// members' CPU, by component.
func runCosts(ctx context.Context, r *bench.Runner, opts bench.Options, out string) error {
	o := bench.CostOptions{}
	if opts.Set["trials"] {
		o.Trials = opts.Trials
	}
	if opts.Set["workers"] {
		o.Workers = opts.Workload.Workers
	}
	if opts.Set["duration"] {
		o.Window = opts.Workload.Duration
	}
	rep, err := r.RunCosts(ctx, o)
	opts.Progress.(*progress).close()
	if len(rep.Samples) == 0 {
		return err
	}
	table := bench.CostsMarkdown(rep)
	if fit, ferr := bench.SimCostsFrom(rep, rep.Backend); ferr == nil {
		table += "\nThe simulator's step costs fitted to these figures (bench.SimCostsFrom), and the model on them beside each figure:\n\n" + bench.CostFitMarkdown(fit)
	} else {
		logf("no simulator costs fitted: %v", ferr)
	}
	fmt.Println()
	fmt.Print(table)
	if out != "" {
		if err := os.MkdirAll(out, 0o755); err != nil {
			return err
		}
		raw, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		for name, b := range map[string][]byte{"costs.md": []byte(table), "costs.json": raw} {
			if werr := os.WriteFile(filepath.Join(out, name), b, 0o644); werr != nil {
				return werr
			}
		}
		logf("wrote %s/costs.md and costs.json", out)
	}
	return err
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "routebench: "+format+"\n", args...)
}

// interruptible is the run's context: the first SIGINT, SIGTERM or SIGHUP
// (a closed terminal must not leave an attached cluster holding the run's
// keys) ends it, and the run writes what it measured and cleans up. A
// second SIGINT or SIGTERM then quits at once, should the cleanup hang; a
// second SIGHUP does not (a closing terminal sends more than one), nor does
// a write to a closed pipe (SIGPIPE: stderr through a pager or tee that
// went with the terminal). stop ends the handling.
func interruptible(logf func(string, ...any)) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	// Handled, so that a write to a closed pipe fails instead of killing
	// the process; nothing reads the channel.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			logf("%v: writing what was measured and cleaning up; interrupt again (SIGINT, SIGTERM) to quit at once (an attached cluster may then keep the run's keys)", s)
			cancel()
		case <-done:
			return
		}
		for {
			select {
			case s := <-sigs:
				if s != syscall.SIGHUP {
					os.Exit(130)
				}
			case <-done:
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}
