// Command storagebench reproduces the paper's Table VII through
// Kubernetes' storage layer: k8s.io/apiserver's etcd3 store, as
// kube-apiserver drives it for POST and GET with the watch cache off (the
// example API group's Pod, protobuf as kube-apiserver stores built-in
// types, the identity transformer kube-apiserver uses without encryption),
// 64 closed-loop workers, 80/20 and 20/80, stock vs pinned vs hybrid, on a
// 3-member test-bed cluster. Writes create pods under fresh names; reads
// get pods created by the preload, by name, with no resource version (a
// quorum read). Trials are interleaved, policies rotated, ratios to stock
// paired by trial, as routebench's.
//
//	cd integrations/kubernetes && go run ./cmd/storagebench
//
// It leaves out what kube-apiserver does around the store: HTTP and TLS to
// the client, authentication, admission, defaulting and validation, and
// serialisation of the response. Those add the same client-side CPU to
// every policy, on the two cores the members share here.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/oproute/oproute/tools/bench"
	"github.com/oproute/oproute/tools/testbed"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "storagebench:", err)
		os.Exit(1)
	}
}

func run() error {
	trials := flag.Int("trials", 3, "trials per policy and mix, interleaved")
	duration := flag.Duration("duration", 10*time.Second, "measured time of one trial")
	policies := flag.String("policies", "stock,pinned,hybrid", "policies to compare, the first the baseline")
	memberCPU := flag.Float64("member-cpu", 0, "confine each member to this many cores (0: shared cores)")
	out := flag.String("out", "", "directory to write tables.md, results.json and results.csv to")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	for _, p := range strings.Split(*policies, ",") {
		if err := checkPolicy(p); err != nil {
			return err
		}
	}
	started := time.Now()
	w := bench.DefaultWorkload()
	w.Duration = *duration
	opts := bench.Options{
		Backend: storageBackend{bench.Etcd{CPUBudgets: testbed.CPUBudgets{MemberCPU: *memberCPU}}}, Workload: w, Trials: *trials,
		Policies: strings.Split(*policies, ","), Set: map[string]bool{"duration": true},
		Progress: lines{}, Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, "storagebench: "+f+"\n", a...) },
	}
	r, err := bench.NewRunner(opts)
	if err != nil {
		return err
	}
	defer r.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	header := headerText(opts)
	fmt.Print(header)
	comps, err := r.Run(ctx, bench.ScenarioKubernetes)
	if len(comps) > 0 {
		fmt.Println()
		fmt.Print(bench.Markdown(comps))
		if *out != "" {
			meta := bench.NewMeta(os.Args, opts.Backend.Name(), w, started)
			meta.CPUModes = []string{bench.RunCPUMode(opts)}
			if werr := bench.WriteFiles(*out, comps, header, meta); werr != nil {
				return werr
			}
		}
	}
	return err
}

func headerText(opts bench.Options) string {
	topo := testbed.DefaultTopology(3)
	cores := "shared cores (members, proxies and client on the same two)"
	if c := opts.Backend.(storageBackend).MemberCPU; c > 0 {
		cores = fmt.Sprintf("each member confined to %.2g cores", c)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "storagebench: k8s.io/apiserver etcd3 store (example Pod, protobuf, identity transformer, no watch cache), Create of fresh names and quorum Get, %d closed-loop workers, %d trial(s) per policy and mix, interleaved, %v measured after %v warm-up\n",
		bench.KubernetesWorkers, opts.Trials, opts.Workload.Duration, opts.Workload.Warmup)
	fmt.Fprintf(&b, "cluster: test bed on 127.0.0.1, zones %v, client in zone %s, one-way %v in a zone and %v across, leader m%d; %s\n",
		topo.Zones, topo.ClientZone, time.Duration(topo.SameZone), time.Duration(topo.CrossZone), topo.Leader, cores)
	fmt.Fprintf(&b, "machine: %d CPUs, %s\n", runtime.NumCPU(), runtime.Version())
	return b.String()
}

// lines reports progress a line a run, on standard error.
type lines struct{}

func (lines) Plan(runs int, total time.Duration) {
	fmt.Fprintf(os.Stderr, "storagebench: %d runs, about %v\n", runs, total.Round(time.Second))
}
func (lines) Start(label string, length time.Duration) {
	fmt.Fprintf(os.Stderr, "storagebench: %s (%v)\n", label, length)
}
func (lines) Finish() {}
