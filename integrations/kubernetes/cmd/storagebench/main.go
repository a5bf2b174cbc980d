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
// With --through apiserver the same workload goes through kube-apiserver
// itself, as a Kubernetes user's does: client-go POSTs and GETs Pods
// (protobuf, unthrottled) on kube-apiserver v1.37.2 built with the
// routed-etcd patch (package apiserver; the first build takes minutes,
// then it is kept), with the watch cache, compaction and the count and
// size polls off. Each trial starts its policy's servers and stops them
// after: one (pinned: one per member, each worker on one, so three on the
// same cores). Its Pods are the core API's, larger than the example
// group's (defaults, managed fields). With --out each server's output is
// kept under kube-apiserver/.
//
// By default it leaves out what kube-apiserver does around the store: HTTP
// and TLS to the client, authentication, admission, defaulting and
// validation, and serialisation of the response. Those add the same
// client-side CPU to every policy, on the two cores the members share
// here; --through apiserver puts them in.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/oproute/oproute/integrations/kubernetes/apiserver"
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
	through := flag.String("through", "store", "store: k8s.io/apiserver's etcd3 store in this process; apiserver: client-go through kube-apiserver v1.37.2 built with the patch (the first build takes minutes)")
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	etcd := bench.Etcd{CPUBudgets: testbed.CPUBudgets{MemberCPU: *memberCPU}}
	var backend bench.Backend = storageBackend{etcd}
	switch *through {
	case "store":
	case "apiserver":
		bin, err := apiserver.Build(ctx, apiserver.Options{Patch: "patches/apiserver-v0.37-routed-etcd.patch", SDK: "../..",
			Log: func(f string, a ...any) { fmt.Fprintf(os.Stderr, "storagebench: build: "+f+"\n", a...) }})
		if err != nil {
			return fmt.Errorf("%w (run from integrations/kubernetes)", err)
		}
		backend = apiserverBackend{Etcd: etcd, Binary: bin, Out: *out}
		// client-go logs each request a trial's end cuts off; the errors
		// that count are the runner's, in the tables.
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	default:
		return fmt.Errorf("--through %q: want store or apiserver", *through)
	}
	opts := bench.Options{
		Backend: backend, Workload: w, Trials: *trials,
		Policies: strings.Split(*policies, ","), Set: map[string]bool{"duration": true},
		Progress: lines{}, Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, "storagebench: "+f+"\n", a...) },
	}
	r, err := bench.NewRunner(opts)
	if err != nil {
		return err
	}
	defer r.Close()
	header := headerText(opts, *memberCPU, *through)
	fmt.Print(header)
	comps, err := r.Run(ctx, bench.ScenarioKubernetes)
	if *through == "apiserver" {
		for i := range comps {
			comps[i].Metrics = append(comps[i].Metrics, apiserverMetrics...)
		}
	}
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

func headerText(opts bench.Options, memberCPU float64, through string) string {
	topo := testbed.DefaultTopology(3)
	cores := "shared cores (members, proxies and client on the same two)"
	if memberCPU > 0 {
		cores = fmt.Sprintf("each member confined to %.2g cores", memberCPU)
	}
	path := "k8s.io/apiserver etcd3 store (example Pod, protobuf, identity transformer, no watch cache), Create of fresh names and quorum Get"
	if through == "apiserver" {
		path = fmt.Sprintf("client-go through kube-apiserver %s with the routed-etcd patch (watch cache off; one server per policy, pinned one per member), POST of fresh Pods and GET", apiserver.KubernetesVersion)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "storagebench: %s, %d closed-loop workers, %d trial(s) per policy and mix, interleaved, %v measured after %v warm-up\n",
		path, bench.KubernetesWorkers, opts.Trials, opts.Workload.Duration, opts.Workload.Warmup)
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
