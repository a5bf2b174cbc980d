package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sclient "k8s.io/client-go/kubernetes"

	"github.com/oproute/oproute/integrations/kubernetes/apiserver"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/bench"
	"github.com/oproute/oproute/tools/testbed"
)

// apiserverBackend is bench's etcd backend whose clients are client-go's,
// through kube-apiserver built with the routed-etcd patch (Binary, from
// apiserver.Build): the paper's Table VII as a Kubernetes user meets it,
// HTTP, authentication, admission and serialisation included. Its Name
// stays "etcd", so that the runner keeps etcd's stock baselines.
type apiserverBackend struct {
	bench.Etcd
	Binary string
	// Out keeps each server's output (a file each under Out/kube-apiserver);
	// empty discards it.
	Out string
}

func (b apiserverBackend) Start(ctx context.Context, topo testbed.Topology) (bench.Cluster, error) {
	inner, err := b.Etcd.Start(ctx, topo)
	if err != nil {
		return nil, err
	}
	return &apiserverCluster{Cluster: inner, binary: b.Binary, out: b.Out}, nil
}

// Attach is not offered: the preload creates the pods the reads get.
func (apiserverBackend) Attach(context.Context, bench.AttachOptions) (bench.Cluster, error) {
	return nil, errors.New("storagebench: runs on the test bed only")
}

// apiserverCluster starts kube-apiservers on its cluster for each client:
// a fresh set per Connect (one server; pinned: one per member, given that
// member alone in --etcd-servers, each worker on one, as the store's
// pinned clients are), stopped by the client's Close. So a trial runs
// beside no other policy's idle servers (each holds a routed client per
// resource, probing the members), and each policy's server starts as
// cold as the others'; a start is seconds, inside the runner's setup.
type apiserverCluster struct {
	bench.Cluster
	binary string
	// out is where servers' outputs go (a file each), empty for none.
	out string

	nsOnce sync.Once
	nsErr  error

	created sync.Map     // bench keys whose pod exists
	fresh   atomic.Int64 // names of pods created after the preload
	started atomic.Int64 // servers started, for their output files' names
}

// serverArgs keep kube-apiserver's background work on etcd out of the
// measurement, as the store's client does: no compaction (every 5 minutes
// by default), no object-count and database-size polls.
var serverArgs = []string{"--etcd-compaction-interval=0", "--etcd-count-metric-poll-period=0", "--etcd-db-metric-poll-interval=0"}

// startServers starts policy's servers.
func (c *apiserverCluster) startServers(ctx context.Context, policy string) ([]*server, error) {
	if err := checkPolicy(policy); err != nil {
		return nil, err
	}
	eps := c.Endpoints()
	etcds, env := [][]string{eps}, policy
	switch policy {
	case bench.Stock:
		env = ""
	case bench.Pinned:
		etcds, env = nil, ""
		for _, ep := range eps {
			etcds = append(etcds, []string{ep})
		}
	}
	var ss []*server
	closeAll := func() {
		for _, s := range ss {
			s.Close()
		}
	}
	for _, e := range etcds {
		file, err := c.output(policy)
		if err != nil {
			closeAll()
			return nil, err
		}
		routed := &routedLines{}
		var out io.Writer = routed
		if file != nil {
			out = io.MultiWriter(file, routed)
		}
		srv, err := apiserver.Start(ctx, apiserver.RunOptions{Binary: c.binary, Etcd: e, Policy: env, Args: serverArgs, Output: out})
		if err != nil {
			if file != nil {
				file.Close()
			}
			closeAll()
			return nil, fmt.Errorf("storagebench: kube-apiserver for %s: %w (its output: %s)", policy, err, outputName(file))
		}
		ss = append(ss, &server{srv, file})
		// A server that reads no policy would pass for a routed one: its
		// routed clients log, named, from the start.
		if env != "" && !routed.seenWithin(ctx, 10*time.Second) {
			closeAll()
			return nil, fmt.Errorf("storagebench: kube-apiserver for %s logged no routed client's line in 10 s (its output: %s)", policy, outputName(file))
		}
	}
	c.nsOnce.Do(func() { c.nsErr = createNamespace(ctx, ss[0].Server) })
	if c.nsErr != nil {
		closeAll()
		return nil, c.nsErr
	}
	return ss, nil
}

// server is a kube-apiserver and the file its output goes to (nil:
// discarded), which outlives it.
type server struct {
	*apiserver.Server
	log *os.File
}

func (s *server) Close() error {
	err := s.Server.Close()
	if s.log != nil {
		err = errors.Join(err, s.log.Close())
	}
	return err
}

// output is a file for a server's output under the run's directory, or
// nil (discarded) without one.
func (c *apiserverCluster) output(policy string) (*os.File, error) {
	if c.out == "" {
		return nil, nil
	}
	dir := filepath.Join(c.out, "kube-apiserver")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("storagebench: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%03d-%s.log", c.started.Add(1), strings.ReplaceAll(policy, "+", "_"))))
	if err != nil {
		return nil, fmt.Errorf("storagebench: %w", err)
	}
	return f, nil
}

func outputName(f *os.File) string {
	if f == nil {
		return "discarded: run with --out to keep it"
	}
	return f.Name()
}

func createNamespace(ctx context.Context, s *apiserver.Server) error {
	cs, err := clientset(s)
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("storagebench: namespace %s: %w", namespace, err)
	}
	return nil
}

// routedLines notes whether a server's output holds a line of the routed
// client (its component named).
type routedLines struct{ seen atomic.Bool }

func (w *routedLines) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(`"component":"oproute"`)) {
		w.seen.Store(true)
	}
	return len(p), nil
}

// seenWithin polls for a routed line until d passes.
func (w *routedLines) seenWithin(ctx context.Context, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for !w.seen.Load() {
		select {
		case <-ctx.Done():
			return w.seen.Load()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// clientset is client-go's for s as controllers configure theirs:
// protobuf, and unthrottled (the default limit, 5 requests a second, would
// measure the limiter, not the server).
func clientset(s *apiserver.Server) (*k8sclient.Clientset, error) {
	cfg := s.RESTConfig()
	cfg.QPS = -1
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return k8sclient.NewForConfig(cfg)
}

// Connect starts policy's servers and returns a client-go client of them
// (conns is the store's setting, not theirs: each server keeps its own
// connections), which stops them when it closes.
func (c *apiserverCluster) Connect(ctx context.Context, policy string, _ int) (bench.Client, error) {
	ss, err := c.startServers(ctx, policy)
	if err != nil {
		return nil, err
	}
	cl := &apiserverClient{cluster: c, servers: ss}
	for _, s := range ss {
		cs, err := clientset(s.Server)
		if err != nil {
			cl.Close()
			return nil, err
		}
		cl.sets = append(cl.sets, cs)
	}
	return cl, nil
}

// apiserverClient does the benchmark's writes as POSTs of Pods and its
// reads as GETs of them, through client-go.
type apiserverClient struct {
	cluster *apiserverCluster
	servers []*server
	sets    []*k8sclient.Clientset
}

func (c *apiserverClient) pods(ctx context.Context) podsAPI {
	return c.sets[bench.WorkerOf(ctx)%len(c.sets)].CoreV1().Pods(namespace)
}

type podsAPI interface {
	Create(context.Context, *corev1.Pod, metav1.CreateOptions) (*corev1.Pod, error)
	Get(context.Context, string, metav1.GetOptions) (*corev1.Pod, error)
}

// Write creates a pod: named after key the first time (the preload, which
// the reads then get), under a fresh name every time after, as the store's
// client does.
func (c *apiserverClient) Write(ctx context.Context, key string, value []byte) error {
	name := podName(key)
	if _, loaded := c.cluster.created.LoadOrStore(key, struct{}{}); loaded {
		name = fmt.Sprintf("w-%d", c.cluster.fresh.Add(1))
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "bench"},
			Annotations: map[string]string{"bench/payload": strings.Repeat("x", len(value))}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways, NodeName: "node-1",
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
	}
	_, err := c.pods(ctx).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

// Read gets the pod of key with no resource version: with the watch cache
// off, a quorum read from etcd.
func (c *apiserverClient) Read(ctx context.Context, key, end string) error {
	if end != "" {
		return errors.New("storagebench: range reads are not part of the workload")
	}
	_, err := c.pods(ctx).Get(ctx, podName(key), metav1.GetOptions{})
	return err
}

// Stats is empty: the router is in the server's process.
func (c *apiserverClient) Stats() router.Stats { return router.Stats{} }

// Close stops the client's servers.
func (c *apiserverClient) Close() error {
	var errs []error
	for _, s := range c.servers {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
