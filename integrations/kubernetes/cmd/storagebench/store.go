package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	"k8s.io/utils/clock"

	"github.com/oproute/oproute/backends/etcd"
	okube "github.com/oproute/oproute/integrations/kubernetes"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/bench"
	"github.com/oproute/oproute/tools/testbed"
)

// The example API group of k8s.io/apiserver, stored as kube-apiserver
// stores built-in types: protobuf.
var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
	codec  runtime.Codec
)

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		panic("no protobuf serializer in the codec factory")
	}
	codec = codecs.CodecForVersions(info.Serializer, codecs.UniversalDeserializer(), examplev1.SchemeGroupVersion, example.SchemeGroupVersion)
}

// kube-apiserver's layout of keys: the storage prefix, the resource's.
const (
	storagePrefix  = "/registry"
	resourcePrefix = "/pods"
	namespace      = "bench"
)

// storageBackend is bench's etcd backend whose clients go through
// k8s.io/apiserver's etcd3 store: its Name stays "etcd", so that the
// runner keeps etcd's stock baselines.
type storageBackend struct{ bench.Etcd }

func (b storageBackend) Start(ctx context.Context, topo testbed.Topology) (bench.Cluster, error) {
	inner, err := b.Etcd.Start(ctx, topo)
	if err != nil {
		return nil, err
	}
	zones := map[string]string{}
	for i, ep := range inner.Endpoints() {
		zones[ep] = topo.Zones[i]
	}
	return newStorageCluster(inner, topo.ClientZone, zones)
}

// Attach is not offered: the preload creates the pods the reads get, once
// per cluster, which an existing cluster may already hold.
func (storageBackend) Attach(context.Context, bench.AttachOptions) (bench.Cluster, error) {
	return nil, errors.New("storagebench: runs on the test bed only")
}

// compactor is what etcd3.NewCompactor returns: etcd3.Compactor, stopped
// when the cluster closes.
type compactor interface {
	etcd3.Compactor
	Stop()
}

// storageCluster hands out storage-layer clients of one cluster. Its
// compactor has a client of its own, as kube-apiserver's has, so that
// what it does is the same for every policy.
type storageCluster struct {
	bench.Cluster
	clientZone string
	zones      map[string]string // by endpoint; nil when unknown

	compactorClient *clientv3.Client
	compactor       compactor
	created         sync.Map     // bench keys whose pod exists
	fresh           atomic.Int64 // names of pods created after the preload
}

func newStorageCluster(inner bench.Cluster, clientZone string, zones map[string]string) (*storageCluster, error) {
	cli, err := clientv3.New(clientConfig(inner.Endpoints()))
	if err != nil {
		inner.Close()
		return nil, err
	}
	// Interval 0: no compaction during the short trials (kube-apiserver
	// compacts every 5 minutes).
	return &storageCluster{Cluster: inner, clientZone: clientZone, zones: zones, compactorClient: cli,
		compactor: etcd3.NewCompactor(cli, 0, clock.RealClock{}, nil)}, nil
}

func (c *storageCluster) Close() error {
	c.compactor.Stop()
	return errors.Join(c.compactorClient.Close(), c.Cluster.Close())
}

// clientConfig is kube-apiserver's client configuration for endpoints.
func clientConfig(endpoints []string) clientv3.Config {
	return okube.APIServerConfig(clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop()})
}

// Connect returns a client whose calls go through an etcd3 store: stock
// etcd kubernetes.New as kube-apiserver builds it (Stock), one such client
// per endpoint with each worker on one (Pinned), or the routed client
// (router policies).
func (c *storageCluster) Connect(ctx context.Context, policy string, conns int) (bench.Client, error) {
	sc := &storageClient{cluster: c}
	add := func(kc *kubernetes.Client) error {
		st, err := etcd3.New(kc, c.compactor, codec, newPod, newPodList, storagePrefix, resourcePrefix,
			schema.GroupResource{Resource: "pods"}, identity.NewEncryptCheckTransformer(), etcd3.NewDefaultLeaseManagerConfig(),
			etcd3.NewDefaultDecoder(codec, storage.APIObjectVersioner{}), storage.APIObjectVersioner{})
		if err != nil {
			kc.Close()
			return err
		}
		sc.clients, sc.stores = append(sc.clients, kc), append(sc.stores, st)
		return nil
	}
	eps := c.Endpoints()
	var err error
	switch policy {
	case bench.Stock:
		var kc *kubernetes.Client
		if kc, err = kubernetes.New(clientConfig(eps)); err == nil {
			err = add(kc)
		}
	case bench.Pinned:
		for k := range conns * len(eps) {
			var kc *kubernetes.Client
			if kc, err = kubernetes.New(clientConfig([]string{eps[k%len(eps)]})); err != nil {
				break
			}
			if err = add(kc); err != nil {
				break
			}
		}
	default:
		if err := checkPolicy(policy); err != nil {
			return nil, err
		}
		opts := []etcd.Option{etcd.WithPolicy(policy), etcd.WithConnsPerMember(conns)}
		if c.zones != nil {
			opts = append(opts, etcd.WithZones(c.clientZone, c.zones))
		}
		var ec *etcd.Client
		cfg := clientConfig(eps)
		opts = append(opts, etcd.WithConnectTimeout(cfg.DialTimeout)) // as kubernetes.New waits
		if ec, err = etcd.New(cfg, opts...); err == nil {
			sc.routed = ec
			err = add(okube.Wrap(ec))
		}
	}
	if err != nil {
		sc.Close()
		return nil, err
	}
	return sc, nil
}

// checkPolicy accepts the clients storagebench can build: stock, pinned
// and the router's policies.
func checkPolicy(p string) error {
	if p == bench.Stock || p == bench.Pinned || slices.Contains(router.Policies(), p) || p == bench.HybridP2C || p == bench.HybridHedge {
		return nil
	}
	return fmt.Errorf("storagebench: policy %q: want %s, %s or one of the router's %v", p, bench.Stock, bench.Pinned, router.Policies())
}

// storageClient does the benchmark's writes as creates of example Pods and
// its reads as gets of them, through etcd3 stores (one per client).
type storageClient struct {
	cluster *storageCluster
	clients []*kubernetes.Client
	stores  []storage.Interface
	routed  *etcd.Client // nil for the stock clients
}

func (c *storageClient) store(ctx context.Context) storage.Interface {
	return c.stores[bench.WorkerOf(ctx)%len(c.stores)]
}

// podName is the name of the pod for a bench key ("bench/0000042").
func podName(key string) string { return "p-" + key[strings.LastIndexByte(key, '/')+1:] }

// Write creates a pod: named after key the first time (the preload, which
// the reads then get), under a fresh name every time after, as a POST of
// a new object does.
func (c *storageClient) Write(ctx context.Context, key string, value []byte) error {
	name := podName(key)
	if _, loaded := c.cluster.created.LoadOrStore(key, struct{}{}); loaded {
		name = fmt.Sprintf("w-%d", c.cluster.fresh.Add(1))
	}
	pod := &example.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app": "bench"},
			Annotations: map[string]string{"bench/payload": strings.Repeat("x", len(value))}},
		Spec: example.PodSpec{RestartPolicy: "Always", NodeName: "node-1", ServiceAccountName: "default"},
	}
	return c.store(ctx).Create(ctx, resourcePrefix+"/"+namespace+"/"+name, pod, &example.Pod{}, 0)
}

// Read gets the pod of key with no resource version: a quorum read from
// etcd, as a GET does with the watch cache off. Ranges are not Table VII's.
func (c *storageClient) Read(ctx context.Context, key, end string) error {
	if end != "" {
		return errors.New("storagebench: range reads are not part of the workload")
	}
	return c.store(ctx).Get(ctx, resourcePrefix+"/"+namespace+"/"+podName(key), storage.GetOptions{}, &example.Pod{})
}

func (c *storageClient) Stats() router.Stats {
	if c.routed == nil {
		return router.Stats{}
	}
	return c.routed.Stats()
}

func (c *storageClient) Close() error {
	var errs []error
	for _, st := range c.stores {
		if cl, ok := st.(interface{ Close() }); ok {
			cl.Close()
		}
	}
	if c.routed != nil {
		return c.routed.Close() // waits for its router to end
	}
	for _, kc := range c.clients {
		errs = append(errs, kc.Close())
	}
	return errors.Join(errs...)
}

func newPod() runtime.Object     { return &example.Pod{} }
func newPodList() runtime.Object { return &example.PodList{} }
