package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8sclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/oproute/oproute/integrations/kubernetes/apiserver"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/tools/testbed"
)

// The operator's timeline, from the start of the load.
const (
	loadFor       = 40 * time.Second
	moveAt        = 8 * time.Second
	killAt        = 18 * time.Second
	restartAt     = 30 * time.Second
	loadWorkers   = 64
	preloadedPods = 50
	// requestLimit bounds each request past the load's end, so that every
	// request begun is counted, as a failure if it never answered.
	requestLimit = 15 * time.Second
	// settledWindow is one stable probe interval of the router's, and of
	// kube-apiserver's database-size poll.
	settledWindow = 30 * time.Second
)

// TestAPIServerLeaderChanges drives kube-apiserver with client-go at
// Table VII's load (64 workers, 80/20 GET and POST of Pods) while the etcd
// leader is moved and then killed (and restarted), once with the routed
// client (OPROUTE_ETCD_POLICY=hybrid) and once with etcd's stock client,
// each on a cluster of its own. It reports what an operator watches: the
// failed requests and the P99 of the answered ones after each fault and
// the restart, when each fault's last failure came, the informer's
// relists, /readyz's etcd check, the connections each member accepted
// from the server's etcd clients and their Status RPCs per second,
// settled and after the election. It asserts that a client-go informer
// holds every Pod the workers created, and that /readyz/etcd answered ok
// after each fault before the next and at the end. The two kinds' failed
// requests are compared in the log: one run of each, a handful of
// requests either way, is noise.
func TestAPIServerLeaderChanges(t *testing.T) {
	ctx, bin := buildAPIServer(t)
	for _, tc := range []struct{ name, policy string }{{"routed", "hybrid"}, {"stock", ""}} {
		t.Run(tc.name, func(t *testing.T) { runLeaderChanges(ctx, t, bin, tc.name, tc.policy) })
	}
}

func runLeaderChanges(ctx context.Context, t *testing.T, bin, name, policy string) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: testbed.DefaultTopology(3)})
	// Compaction off: a watch the informer resumes finds its revision,
	// so that a relist is the faults' doing.
	srv, _ := startAPIServerT(ctx, t, apiserver.RunOptions{Binary: bin, Etcd: c.Endpoints(), Policy: policy,
		Args: []string{"--etcd-compaction-interval=0"}})
	cfg := srv.RESTConfig()
	cfg.QPS = -1                                            // unthrottled: the default 5 per second would measure the limiter
	cfg.ContentType = "application/vnd.kubernetes.protobuf" // as Kubernetes' own components talk
	cs, err := k8sclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := "oproute-leader"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := cs.CoreV1().Pods(ns)
	for i := range preloadedPods {
		if _, err := pods.Create(ctx, benchPod(fmt.Sprintf("pre-%02d", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Settled, before the load: the connections the server's etcd clients
	// made (each client one per member) and their probes.
	conns := make([]uint64, c.Size())
	for i := range conns {
		conns[i] = c.Member(i).ClientConnections()
	}
	before := statusCounts(t, c, -1)
	time.Sleep(settledWindow) // the measured window, not a wait for anything
	settled := statusRate(before, statusCounts(t, c, -1), settledWindow)
	t.Logf("connections the members accepted from the server: %v; settled, %.2f Status RPCs per second in all (over %v)", conns, settled, settledWindow)

	inf := newPodInformer(t, cs, ns)
	infCtx, stopInf := context.WithCancel(ctx)
	infDone := make(chan struct{})
	go func() { defer close(infDone); inf.informer.RunWithContext(infCtx) }()
	defer func() { stopInf(); <-infDone }()
	syncCtx, cancelSync := context.WithTimeout(ctx, time.Minute)
	synced := cache.WaitForCacheSync(syncCtx.Done(), inf.informer.HasSynced)
	cancelSync()
	if !synced {
		t.Fatal("the informer did not sync within a minute")
	}
	listsAtSync := inf.lists.Load()

	rec := &requestLog{start: time.Now()}
	created := &sync.Map{}
	var fresh atomic.Int64
	loadCtx, stopLoad := context.WithTimeout(ctx, loadFor)
	var wg sync.WaitGroup
	defer func() { stopLoad(); wg.Wait() }()
	for w := range loadWorkers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for loadCtx.Err() == nil {
				// Each request outlives the load's end, bounded: one begun
				// in a fault's window is counted however it ends.
				reqCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestLimit)
				begin := time.Now()
				var err error
				if rng.Float64() < 0.2 {
					name := fmt.Sprintf("w-%d", fresh.Add(1))
					if _, err = pods.Create(reqCtx, benchPod(name), metav1.CreateOptions{}); err == nil {
						created.Store(name, true)
					}
				} else {
					_, err = pods.Get(reqCtx, fmt.Sprintf("pre-%02d", rng.IntN(preloadedPods)), metav1.GetOptions{})
				}
				cancel()
				rec.add(begin, time.Since(begin), err)
			}
		})
	}
	readyz := &readyzLog{start: rec.start}
	probeReadyz := func(c context.Context) bool {
		// A kubelet's readiness probe waits a second.
		pctx, cancel := context.WithTimeout(c, time.Second)
		defer cancel()
		body, err := cs.CoreV1().RESTClient().Get().AbsPath("/readyz/etcd").DoRaw(pctx)
		return err == nil && string(body) == "ok"
	}
	wg.Go(func() {
		for loadCtx.Err() == nil {
			readyz.add(probeReadyz(context.WithoutCancel(ctx)))
			select {
			case <-loadCtx.Done():
			case <-time.After(500 * time.Millisecond): // half a readiness probe's period
			}
		}
	})

	// The faults, on the load's clock; each one's time is when it was
	// done, and a step more than a second late fails the run.
	at := func(d time.Duration) time.Duration {
		select {
		case <-loadCtx.Done():
		case <-time.After(time.Until(rec.start.Add(d))):
		}
		now := time.Since(rec.start)
		if late := now - d; late > time.Second {
			t.Fatalf("the fault planned at %v came %v late", d, late.Round(time.Millisecond))
		}
		return now
	}
	waitLeader := func() int {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := c.WaitLeader(lctx)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	var faults [3]time.Duration // move, kill, restart
	faults[0] = at(moveAt)
	leader := waitLeader()
	mctx, cancelMove := context.WithTimeout(ctx, killAt-moveAt-2*time.Second)
	err = c.MoveLeader(mctx, (leader+1)%c.Size())
	cancelMove()
	if err != nil {
		t.Fatal(err)
	}
	faults[1] = at(killAt)
	killed := waitLeader()
	if err := c.Kill(killed); err != nil {
		t.Fatal(err)
	}
	waitLeader()
	elected, afterElection := time.Now(), statusCounts(t, c, killed)
	faults[2] = at(restartAt)
	electedRate := statusRate(afterElection, statusCounts(t, c, killed), time.Since(elected))
	if err := c.Restart(ctx, killed); err != nil {
		t.Fatal(err)
	}
	<-loadCtx.Done()
	wg.Wait()
	t.Logf("after the election, %.2f Status RPCs per second from the two members left (settled %.2f from three)", electedRate, settled)

	// /readyz/etcd answers ok again after each fault before the next,
	// and once the load is over.
	// A window runs to the next fault; the last, to the last request's end.
	ends := []time.Duration{faults[1], faults[2], loadFor + requestLimit}
	for i, f := range faults {
		if !readyz.okAfterLastFailure(f, ends[i]) {
			t.Errorf("/readyz/etcd: no ok answer after its last failure between %v and %v", f.Round(time.Millisecond), ends[i])
		}
	}
	testutil.Poll(t, 10*time.Second, "/readyz/etcd ok after the load", func() bool { return probeReadyz(ctx) })

	// Every Pod a worker created is in the informer's store.
	var want []string
	created.Range(func(k, _ any) bool { want = append(want, k.(string)); return true })
	testutil.PollWhy(t, 30*time.Second, "the informer holds every created Pod", func() (bool, string) {
		var missing []string
		for _, name := range want {
			if _, ok, _ := inf.informer.GetStore().GetByKey(ns + "/" + name); !ok {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0, fmt.Sprintf("%d of %d missing, e.g. %v", len(missing), len(want), missing[:min(len(missing), 5)])
	})

	requests, failed := rec.counts(0, loadFor+requestLimit)
	for _, f := range rec.failures() {
		t.Logf("%s: failed request %s", name, f)
	}
	t.Logf("%s: %d requests, %d failed; informer: %d Pods created, %d relists; /readyz/etcd failed %d of %d",
		name, requests, failed, len(want), inf.lists.Load()-listsAtSync, readyz.failed(), readyz.len())
	for i, what := range []string{"leader move", "leader kill", "restart"} {
		f := rec.fault(faults[i], ends[i])
		t.Logf("%s: %s at %v: %d of %d requests failed, P99 of the answered %v, last failure %v after",
			name, what, faults[i].Round(time.Millisecond), f.failed, f.requests, f.p99.Round(time.Millisecond), f.lastFailure.Round(time.Millisecond))
	}
}

func benchPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "bench"}},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
	}
}

// statusCounts is each member's Status RPCs served so far, by its own
// /metrics; skip is a member that is down (-1: none).
func statusCounts(t *testing.T, c *testbed.EtcdCluster, skip int) map[int]uint64 {
	t.Helper()
	out := map[int]uint64{}
	for i := range c.Size() {
		if i == skip {
			continue
		}
		counts, err := c.GRPCCounts(t.Context(), i)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = counts["etcdserverpb.Maintenance/Status"]
	}
	return out
}

// statusRate is the Status RPCs per second served between two counts, of
// the members in both.
func statusRate(before, after map[int]uint64, over time.Duration) float64 {
	var n uint64
	for i, a := range after {
		if b, ok := before[i]; ok {
			n += a - b
		}
	}
	return float64(n) / over.Seconds()
}

// podInformer is a client-go informer on a namespace's Pods that counts
// its lists: a List, or a watch that begins with the current state (the
// watch-list client-go uses by default, which the server serves without
// its watch cache too).
type podInformer struct {
	informer cache.SharedIndexInformer
	lists    atomic.Int64
}

func newPodInformer(t *testing.T, cs *k8sclient.Clientset, ns string) *podInformer {
	p := &podInformer{}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l, err := cs.CoreV1().Pods(ns).List(ctx, o)
			if err == nil {
				p.lists.Add(1)
			}
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := cs.CoreV1().Pods(ns).Watch(ctx, o)
			if err == nil && o.SendInitialEvents != nil && *o.SendInitialEvents {
				p.lists.Add(1)
			}
			return w, err
		},
	}
	p.informer = cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	if _, err := p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// readyzLog records /readyz/etcd's answers on the load's clock.
type readyzLog struct {
	start   time.Time
	mu      sync.Mutex
	answers []readyzAnswer
}

type readyzAnswer struct {
	at time.Duration
	ok bool
}

func (l *readyzLog) add(ok bool) {
	l.mu.Lock()
	l.answers = append(l.answers, readyzAnswer{time.Since(l.start), ok})
	l.mu.Unlock()
}

func (l *readyzLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.answers)
}

func (l *readyzLog) failed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, a := range l.answers {
		if !a.ok {
			n++
		}
	}
	return n
}

// okAfterLastFailure reports whether the last answer in [from, to) was ok
// (true when there was none: the probe had no chance to fail).
func (l *readyzLog) okAfterLastFailure(from, to time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ok := true
	for _, a := range l.answers {
		if a.at >= from && a.at < to {
			ok = a.ok
		}
	}
	return ok
}

// requestLog records each request's start (since start), latency and
// outcome.
type requestLog struct {
	start time.Time
	mu    sync.Mutex
	reqs  []request
}

type request struct {
	at, took time.Duration
	failed   bool
	why      string // a failure's kind
}

func (l *requestLog) add(begin time.Time, took time.Duration, err error) {
	r := request{at: begin.Sub(l.start), took: took, failed: err != nil}
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		r.why = fmt.Sprintf("no answer in %v", requestLimit)
	default:
		reason := string(apierrors.ReasonForError(err))
		if reason == "" {
			reason = "no reason given"
		}
		r.why = fmt.Sprintf("HTTP %d, %s", statusCode(err), reason)
	}
	l.mu.Lock()
	l.reqs = append(l.reqs, r)
	l.mu.Unlock()
}

// statusCode is the HTTP status of a Kubernetes API error, 0 for another.
func statusCode(err error) int32 {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return s.Status().Code
	}
	return 0
}

// failures lists the failed requests: when each began, how long it took,
// and why it failed.
func (l *requestLog) failures() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reqs {
		if r.failed {
			out = append(out, fmt.Sprintf("at %v, %v: %s", r.at.Round(time.Millisecond), r.took.Round(time.Millisecond), r.why))
		}
	}
	return out
}

// counts are the requests begun in [from, to) and how many failed.
func (l *requestLog) counts(from, to time.Duration) (n, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.reqs {
		if r.at >= from && r.at < to {
			n++
			if r.failed {
				failed++
			}
		}
	}
	return n, failed
}

// faultRecord is what followed one fault, until the next.
type faultRecord struct {
	requests, failed int
	p99              time.Duration // of the answered requests
	lastFailure      time.Duration // from the fault to the last failed request's end; 0 with none
}

// fault is the record of the requests that ended in [from, to): those
// in flight when the fault came included, each request in one window.
func (l *requestLog) fault(from, to time.Duration) faultRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var f faultRecord
	var took []time.Duration
	for _, r := range l.reqs {
		end := r.at + r.took
		if end < from || end >= to {
			continue
		}
		f.requests++
		if r.failed {
			f.failed++
			f.lastFailure = max(f.lastFailure, end-from)
			continue
		}
		took = append(took, r.took)
	}
	if n := len(took); n > 0 {
		slices.Sort(took)
		f.p99 = took[(n*99+99)/100-1]
	}
	return f
}
