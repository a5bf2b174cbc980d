package kubernetes_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"
	"google.golang.org/grpc/connectivity"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/utils/clock"

	okube "github.com/oproute/oproute/integrations/kubernetes"
	"github.com/oproute/oproute/tools/testbed"
)

// The client under test and the leader-move mode. Flags go after -args
// (go test -args -client=stock); the environment variables set their
// defaults, for scripts.
var (
	clientKind = flag.String("client", envOr("OPROUTE_K8S_CLIENT", "routed"),
		"client under test: routed (integrations/kubernetes.New) or stock (etcd's kubernetes.New, kube-apiserver's settings)")
	moveLeaderEvery = flag.Duration("move-leader", envDuration("OPROUTE_K8S_MOVE_LEADER"),
		"hand the shared cluster's leadership to the next member this often during TestStorage (0: never)")
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envDuration(name string) time.Duration {
	d, err := time.ParseDuration(os.Getenv(name))
	if err != nil {
		return 0 // unset or malformed: the flag's own parse reports a bad -move-leader
	}
	return d
}

// The example API group of k8s.io/apiserver, as its etcd3 tests register it.
var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
}

// valuePrefix is what the default transformer puts before every stored
// value, as in the upstream tests (defaultTestPrefix).
const valuePrefix = "test!"

// fixture is a cluster and the client its stores' compactors share: kube-
// apiserver gives its compactor a client of its own (startCompactorOnce),
// which also keeps the compactor's reads of compact_rev_key out of a
// test's read counts (the call-counting list tests).
type fixture struct {
	c         *testbed.EtcdCluster
	compactor *kubernetes.Client
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	return &fixture{c: c, compactor: newClient(t, c)}
}

// newClient returns a client of the kind under test, closed when t ends.
func newClient(t testing.TB, c *testbed.EtcdCluster) *kubernetes.Client {
	t.Helper()
	cfg := clientv3.Config{Endpoints: c.Endpoints(), TLS: c.ClientTLS(), Logger: zap.NewNop()}
	var (
		kc  *kubernetes.Client
		err error
	)
	switch *clientKind {
	case "routed":
		kc, err = okube.New(cfg)
	case "stock":
		kc, err = kubernetes.New(okube.APIServerConfig(cfg))
		if err == nil {
			err = blockUntilReady(kc, 20*time.Second)
		}
	default:
		t.Fatalf("-client=%q: want routed or stock", *clientKind)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kc.Close() })
	return kc
}

// blockUntilReady waits for a ready connection, as kube-apiserver does after
// kubernetes.New (factory/etcd3.go); the routed New waits for the leader.
func blockUntilReady(kc *kubernetes.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn := kc.ActiveConnection()
	for {
		state := conn.GetState()
		if state == connectivity.Ready {
			return nil
		}
		if state == connectivity.Idle {
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, state) {
			return fmt.Errorf("etcd connection not ready: %w", ctx.Err())
		}
	}
}

// testStore is an etcd3 store on a client of its own, with what the shared
// tests ask of the upstream test store through exported API only.
type testStore struct {
	storage.Interface
	client     *kubernetes.Client // with the recorders, as testserver.RunEtcd leaves it
	kv         *storagetesting.KVRecorder
	lists      *storagetesting.KubernetesRecorder
	codec      runtime.Codec
	swap       *swapTransformer // what the store and its watcher hold
	pathPrefix string           // the store's key prefix in etcd, ending in "/"
}

type setupOptions struct {
	codec        runtime.Codec
	transformer  value.Transformer
	leaseConfig  etcd3.LeaseManagerConfig
	unsafeDelete bool // NewStoreWithUnsafeCorruptObjectDeletion around the store
	rootPrefix   bool // keys at "/", as upstream's: for tests that check error texts naming keys
}

type setupOption func(*setupOptions)

func withCodec(c runtime.Codec) setupOption { return func(o *setupOptions) { o.codec = c } }

func withTransformer(tr value.Transformer) setupOption {
	return func(o *setupOptions) { o.transformer = tr }
}

func withUnsafeDelete() setupOption { return func(o *setupOptions) { o.unsafeDelete = true } }

func withRootPrefix() setupOption { return func(o *setupOptions) { o.rootPrefix = true } }

// setup is the upstream tests' testSetup on f's cluster: the example pods,
// the prefix transformer, leases reused for 1 s, and a store of its own
// under a key prefix named after the test, so that tests sharing a cluster
// never see each other's keys. Feature gates must be set before it: the
// store reads some at construction.
func (f *fixture) setup(t *testing.T, opts ...setupOption) (context.Context, *testStore) {
	t.Helper()
	o := setupOptions{
		codec:       apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion),
		transformer: storagetesting.NewPrefixTransformer([]byte(valuePrefix), false),
		leaseConfig: etcd3.NewDefaultLeaseManagerConfig(),
	}
	// Upstream's newTestLeaseManagerConfig: waits stay under
	// wait.ForeverTestTimeout.
	o.leaseConfig.ReuseDurationSeconds = 1
	for _, opt := range opts {
		opt(&o)
	}

	kc := newClient(t, f.c)
	leases := &leaseLog{Lease: kc.Lease}
	kc.Lease = leases // before the store: its lease manager grants through it
	t.Cleanup(func() {
		if err := leases.revokeAll(context.Background()); err != nil {
			t.Error(err)
		}
	})
	lists := storagetesting.NewKubernetesRecorder(kc.Kubernetes)
	kv := storagetesting.NewKVRecorder(kc.KV, lists)
	kc.KV, kc.Kubernetes = kv, lists

	compactor := etcd3.NewCompactor(f.compactor.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	versioner := storage.APIObjectVersioner{}
	swap := newSwapTransformer(o.transformer)
	prefix := "/" + t.Name() // subtest names are unique; etcd3.New ends it in "/"
	if o.rootPrefix {
		prefix = "/"
	}
	const resourcePrefix = "/pods/"
	gr := schema.GroupResource{Resource: "pods"}
	s, err := etcd3.New(kc, compactor, o.codec, newPod, newPodList, prefix, resourcePrefix, gr,
		swap, o.leaseConfig, etcd3.NewDefaultDecoder(o.codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	var iface storage.Interface = s
	if o.unsafeDelete {
		iface = etcd3.NewStoreWithUnsafeCorruptObjectDeletion(s, gr)
	}
	return t.Context(), &testStore{
		Interface: iface, client: kc, kv: kv, lists: lists, codec: o.codec, swap: swap,
		pathPrefix: path.Join("/", prefix) + "/",
	}
}

func newPod() runtime.Object     { return &example.Pod{} }
func newPodList() runtime.Object { return &example.PodList{} }

// etcdKey is the etcd key of the store key key.
func (s *testStore) etcdKey(key string) string {
	if len(key) > 0 && key[0] == '/' {
		key = key[1:]
	}
	return s.pathPrefix + key
}

// UpdatePrefixTransformer is upstream's storeWithPrefixTransformer: the
// test modifies a copy of the prefix transformer; the returned func puts
// the original back.
func (s *testStore) UpdatePrefixTransformer(modify storagetesting.PrefixTransformerModifier) func() {
	orig := s.swap.load()
	p, ok := orig.(*storagetesting.PrefixTransformer)
	if !ok {
		panic(fmt.Sprintf("UpdatePrefixTransformer on a store whose transformer is a %T", orig))
	}
	cp := *p
	s.swap.store(modify(&cp))
	return func() { s.swap.store(orig) }
}

// UpdateTransformer is upstream's storeWithTransformerOverride.
func (s *testStore) UpdateTransformer(modify storagetesting.TransformerModifier) func() {
	orig := s.swap.load()
	s.swap.store(modify(orig))
	return func() { s.swap.store(orig) }
}

// prefixTransformer is the store's prefix transformer, whose reads the
// call-counting list tests count.
func (s *testStore) prefixTransformer(t *testing.T) *storagetesting.PrefixTransformer {
	p, ok := s.swap.load().(*storagetesting.PrefixTransformer)
	if !ok {
		t.Fatalf("the store's transformer is a %T, not the prefix transformer", s.swap.load())
	}
	return p
}

// checkStorageInvariants is upstream's, at the store's etcd key: the stored
// object has neither resource version nor self link.
func (s *testStore) checkStorageInvariants(ctx context.Context, t *testing.T, key string) {
	resp, err := s.client.KV.Get(ctx, s.etcdKey(key))
	if err != nil {
		t.Fatalf("etcd Get: %v", err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("nothing stored at %s", s.etcdKey(key))
	}
	decoded, err := runtime.Decode(s.codec, resp.Kvs[0].Value[len(valuePrefix):])
	if err != nil {
		t.Fatalf("decoding the stored object: %v\n%s", err, resp.Kvs[0].Value)
	}
	obj := decoded.(*example.Pod)
	if obj.ResourceVersion != "" {
		t.Errorf("stored object has resource version %q, want none", obj.ResourceVersion)
	}
	//lint:ignore SA1019 upstream's invariant: a stale self link must not be stored
	if obj.SelfLink != "" {
		t.Error("stored object has a self link, want none")
	}
}

// increaseRV is upstream's increaseRVFunc.
func (s *testStore) increaseRV(ctx context.Context, t *testing.T) int64 {
	resp, err := s.client.KV.Put(ctx, "increaseRV", "ok")
	if err != nil {
		t.Fatalf("Could not update increaseRV: %v", err)
	}
	return resp.Header.Revision
}

// compact is upstream's compactStorage: compact at resourceVersion, then,
// with ListFromCacheSnapshot, wait until the store's compactor has seen it
// (it learns by watching compact_rev_key and offers no signal: polled).
func (s *testStore) compact(ctx context.Context, t *testing.T, resourceVersion string) {
	rv, err := storage.APIObjectVersioner{}.ParseResourceVersion(resourceVersion)
	if err != nil {
		t.Fatal(err)
	}
	var current int64
	current, _, _, err = etcd3.Compact(ctx, s.client.Client, current, int64(rv))
	if err != nil { // compact_rev_key was at another version: again, from the one read
		_, _, _, err = etcd3.Compact(ctx, s.client.Client, current, int64(rv))
	}
	if err != nil {
		t.Fatal(err)
	}
	if !utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot) {
		return
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for s.CompactRevision() != int64(rv) {
		select {
		case <-ctx.Done():
			t.Fatalf("compaction at %d not observed: %v", rv, ctx.Err())
		case <-tick.C:
		}
	}
}

// keys is the store's getKeys (unexported): the keys of its resource.
func (s *testStore) keys(ctx context.Context) ([]string, error) {
	resp, err := s.client.KV.Get(ctx, s.etcdKey("/pods/"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	keys := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys, nil
}

// checkStorageCalls is upstream's checkStorageCallsInvariants: how many
// objects the transformer read and how many Gets reached etcd, given the
// page size (kube-apiserver doubles a page that comes back short).
func (s *testStore) checkStorageCalls(t *testing.T) storagetesting.CallsValidation {
	const maxLimit = 10000 // etcd3's maxLimit, the most a page grows to
	transformer := s.prefixTransformer(t)
	return func(t *testing.T, pageSize, estimatedProcessedObjects uint64) {
		if reads := transformer.GetReadsAndReset(); reads != estimatedProcessedObjects {
			t.Errorf("unexpected reads: %d, expected: %d", reads, estimatedProcessedObjects)
		}
		estimatedGetCalls := uint64(1)
		if pageSize != 0 {
			currLimit := pageSize
			for sum := uint64(1); sum < estimatedProcessedObjects; {
				currLimit = min(currLimit*2, maxLimit)
				sum += currLimit
				estimatedGetCalls++
			}
		}
		if reads := s.kv.GetReadsAndReset() + s.kv.GetStreamReadsAndReset(); reads != estimatedGetCalls {
			t.Fatalf("unexpected reads: %d, want: %d", reads, estimatedGetCalls)
		}
	}
}

// swapTransformer lets a test replace the transformer that a store and its
// watcher hold, as the upstream tests do by assigning the store's
// unexported fields.
type swapTransformer struct {
	cur atomic.Pointer[transformerBox]
}

type transformerBox struct{ value.Transformer }

func newSwapTransformer(tr value.Transformer) *swapTransformer {
	s := &swapTransformer{}
	s.store(tr)
	return s
}

func (s *swapTransformer) load() value.Transformer    { return s.cur.Load().Transformer }
func (s *swapTransformer) store(tr value.Transformer) { s.cur.Store(&transformerBox{tr}) }
func (s *swapTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return s.load().TransformFromStorage(ctx, data, dataCtx)
}
func (s *swapTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.load().TransformToStorage(ctx, data, dataCtx)
}

// leaseLog records the leases a test's store grants, so that the test
// revokes them as it ends: a lease expiring during a later test on the
// shared cluster would delete keys and move the revision under that
// test's exact-revision checks (RunTestConsistentList).
type leaseLog struct {
	clientv3.Lease
	mu  sync.Mutex
	ids []clientv3.LeaseID
}

func (l *leaseLog) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	resp, err := l.Lease.Grant(ctx, ttl)
	if err == nil {
		l.mu.Lock()
		l.ids = append(l.ids, resp.ID)
		l.mu.Unlock()
	}
	return resp, err
}

func (l *leaseLog) revokeAll(ctx context.Context) error {
	l.mu.Lock()
	ids := l.ids
	l.ids = nil
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, id := range ids {
		if _, err := l.Lease.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("revoking lease %x: %w", id, err)
		}
	}
	return nil
}

// testTransformer and testCodec fail on demand (upstream's).
type testTransformer struct {
	value.Transformer
	fail atomic.Bool
}

func (tt *testTransformer) setFailing(c bool) { tt.fail.Store(c) }

func (tt *testTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	if tt.fail.Load() {
		return nil, false, errors.New("synthetic error")
	}
	return tt.Transformer.TransformFromStorage(ctx, data, dataCtx)
}

type testCodec struct {
	runtime.Codec
	fail atomic.Bool
}

func (tc *testCodec) setFailing(c bool) { tc.fail.Store(c) }

func (tc *testCodec) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if tc.fail.Load() {
		return nil, nil, errors.New("synthetic error")
	}
	return tc.Codec.Decode(data, defaults, into)
}

// corruptObjectError returns the error etcd3 reports for data it cannot
// transform (its unexported corruptObjectError, untransformable, "bits
// flipped"), which the upstream tests construct directly: the exported
// corrupt-object transformer makes the same one.
func corruptObjectError() error {
	tr := etcd3.WithCorruptObjErrorHandlingTransformer(failingTransformer{errors.New("bits flipped")})
	_, _, err := tr.TransformFromStorage(context.Background(), nil, value.DefaultContext(nil))
	return err
}

type failingTransformer struct{ err error }

func (f failingTransformer) TransformFromStorage(context.Context, []byte, value.Context) ([]byte, bool, error) {
	return nil, false, f.err
}

func (f failingTransformer) TransformToStorage(context.Context, []byte, value.Context) ([]byte, error) {
	return nil, f.err
}

// resetFeatureSupportChecker is upstream's resetFeatureSupportCheckerDuringTest:
// whether etcd serves RangeStream is cached process-wide.
func resetFeatureSupportChecker(t *testing.T) {
	orig := etcdfeature.DefaultFeatureSupportChecker
	etcdfeature.DefaultFeatureSupportChecker = etcdfeature.NewDefaultFeatureSupportChecker()
	t.Cleanup(func() { etcdfeature.DefaultFeatureSupportChecker = orig })
}
