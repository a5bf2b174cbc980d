package kubernetes_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	k8sclient "k8s.io/client-go/kubernetes"

	"github.com/oproute/oproute/integrations/kubernetes/apiserver"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/tools/testbed"
)

// apiServerEnv makes the full tier build and run kube-apiserver: its first
// build compiles Kubernetes, minutes that do not fit the tier's floor.
const apiServerEnv = "OPROUTE_KUBE_APISERVER"

// TestAPIServer builds kube-apiserver v1.37.2 from the released sources
// with the patch applied to its k8s.io/apiserver (the binary kept between
// runs, by its inputs) and starts it on a 3-member test-bed cluster, once
// with the routed client (OPROUTE_ETCD_POLICY=hybrid) and once with
// etcd's stock client, the control. Each is driven with client-go: Pods
// created and read back in a namespace of the test's own, a watch that
// delivers the next one, and /readyz's etcd check. By the members' own
// counts, the routed server's writes (kube-apiserver writes with Txns) are
// all at the leader and its reads (the watch cache is off: each Get is a
// linearizable Range) reach the followers too; the stock client's writes
// go round robin, which shows the count can tell them apart.
func TestAPIServer(t *testing.T) {
	ctx, bin := buildAPIServer(t)
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: testbed.DefaultTopology(3)})
	for _, tc := range []struct {
		name, policy string
	}{{"routed", "hybrid"}, {"stock", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, out := startAPIServerT(ctx, t, apiserver.RunOptions{Binary: bin, Etcd: c.Endpoints(), Policy: tc.policy})
			leader, err := c.Leader(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before := servedAll(t, c)
			drive(ctx, t, srv, tc.name)
			after := servedAll(t, c)
			if now, err := c.Leader(ctx); err != nil || now != leader {
				t.Skipf("the leader changed during the window (m%d, then m%d, %v): the counts cannot be judged", leader, now, err)
			}
			var txnLeader, txnElsewhere, readFollowers uint64
			for i := range after {
				txns := after[i].Txns - before[i].Txns
				if i == leader {
					txnLeader += txns
				} else {
					txnElsewhere += txns
					readFollowers += after[i].Reads - before[i].Reads
				}
			}
			routed := bytes.Contains(out.Bytes(), []byte(`"component":"oproute"`))
			t.Logf("%s: Txns %d at the leader, %d elsewhere; Ranges at the followers %d; routed client's log lines %v", tc.name, txnLeader, txnElsewhere, readFollowers, routed)
			if routed != (tc.policy != "") {
				t.Errorf("OPROUTE_ETCD_POLICY=%q, yet the routed client's log lines are present: %v", tc.policy, routed)
			}
			if tc.policy == "" {
				// Round robin: about two thirds of the writes elsewhere.
				if txnElsewhere == 0 {
					t.Errorf("the stock client sent all %d Txns to the leader: the count cannot tell it from the routed one", txnLeader)
				}
				return
			}
			if txnLeader < 21 || float64(txnElsewhere) > 0.01*float64(txnLeader+txnElsewhere) {
				t.Errorf("writes through kube-apiserver: %d Txns at the leader, %d elsewhere; want the 21 creates and at least 99 %% at the leader", txnLeader, txnElsewhere)
			}
			if readFollowers == 0 {
				t.Errorf("no Range at a follower: the routed client's reads were not spread")
			}
		})
	}
}

// buildAPIServer skips t unless apiServerEnv is set, and returns the
// kube-apiserver binary (built, or kept from an earlier build of the same
// inputs) and a context bounded by the test's deadline, less a margin for
// its cleanups.
func buildAPIServer(t *testing.T) (context.Context, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds kube-apiserver and starts it on a test-bed cluster")
	}
	if os.Getenv(apiServerEnv) == "" {
		testutil.Skip(t, "builds kube-apiserver from released sources (minutes from empty caches): set "+apiServerEnv+"=1")
	}
	// The first build compiles Kubernetes: bounded by the test's own
	// deadline, so that a slow build fails here and its compilers end
	// with it.
	limit := 40 * time.Minute
	if d, ok := t.Deadline(); ok {
		limit = time.Until(d) - 30*time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	bin, err := apiserver.Build(ctx, apiserver.Options{Patch: patchFile, SDK: root, Log: t.Logf})
	if err != nil {
		t.Fatalf("%v (a first build takes minutes: run with -timeout 60m)", err)
	}
	t.Logf("kube-apiserver %s with the patch: %s (%v)", apiserver.KubernetesVersion, bin, time.Since(start).Round(time.Second))
	return ctx, bin
}

// startAPIServerT starts kube-apiserver for t and stops it when t ends;
// its output is kept, and shown if t failed.
func startAPIServerT(ctx context.Context, t *testing.T, o apiserver.RunOptions) (*apiserver.Server, *syncBuffer) {
	t.Helper()
	out := &syncBuffer{}
	o.Output = out
	srv, err := apiserver.Start(ctx, o)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.Bytes())
	}
	t.Cleanup(func() {
		srv.Close()
		if t.Failed() {
			t.Logf("kube-apiserver's output:\n%s", out.Bytes())
		}
	})
	return srv, out
}

// drive creates a namespace of its own on srv, 21 Pods in it (reading each
// back), and checks a watch from the first delivers the second, and
// /readyz/etcd.
func drive(ctx context.Context, t *testing.T, srv *apiserver.Server, name string) {
	t.Helper()
	cs, err := k8sclient.NewForConfig(srv.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	// The default namespace is made by a controller after the server is
	// ready; one of the test's own is there once created.
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "oproute-" + name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := cs.CoreV1().Pods(ns.Name)
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
		}
	}
	if _, err := pods.Create(ctx, pod("first"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := pods.Get(ctx, "first", metav1.GetOptions{})
	if err != nil || got.Name != "first" {
		t.Fatalf("the Pod read back: %v, %v", got, err)
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{ResourceVersion: got.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := range 20 {
		name := fmt.Sprintf("next-%02d", i)
		if _, err := pods.Create(ctx, pod(name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := pods.Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case ev := <-w.ResultChan():
		if p, ok := ev.Object.(*corev1.Pod); ev.Type != watch.Added || !ok || p.Name != "next-00" {
			t.Fatalf("the watch delivered %s %T, want the next Pod added", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch delivered nothing within 10 s")
	}
	if body, err := cs.CoreV1().RESTClient().Get().AbsPath("/readyz/etcd").DoRaw(ctx); err != nil || string(body) != "ok" {
		t.Fatalf("/readyz/etcd: %q, %v", body, err)
	}
}

// syncBuffer is a bytes.Buffer that the server's output copier and the
// test may use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// servedAll is what each member of c served so far, by its own /metrics.
func servedAll(t *testing.T, c *testbed.EtcdCluster) []testbed.Served {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]testbed.Served, c.Size())
	for i := range out {
		s, err := c.Served(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = s
	}
	return out
}
