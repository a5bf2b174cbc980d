package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/backends/etcd/etcdtest"
	"github.com/oproute/oproute/tools/testbed"
)

// Etcd is the etcd backend.
type Etcd struct {
	// CPUBudgets confine the test bed's members; zero: shared cores.
	testbed.CPUBudgets
}

// Name implements Backend.
func (Etcd) Name() string { return "etcd" }

// Start implements Backend: a test-bed cluster.
func (e Etcd) Start(ctx context.Context, topo testbed.Topology) (Cluster, error) {
	tb, err := testbed.StartEtcd(ctx, testbed.EtcdOptions{Topology: topo, CPUBudgets: e.CPUBudgets})
	if err != nil {
		return nil, err
	}
	return &etcdCluster{tb: tb, placement: placedOn(tb.Endpoints(), topo), http: &http.Client{Timeout: 5 * time.Second}}, nil
}

// Attach implements Backend: an existing cluster, no fault knobs.
func (Etcd) Attach(ctx context.Context, opts AttachOptions) (Cluster, error) {
	if len(opts.Endpoints) == 0 {
		return nil, etcd.ErrNoEndpoints
	}
	p, err := opts.placement()
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	if opts.TLS != nil { // the members' /metrics are on their client URLs
		hc.Transport = &http.Transport{TLSClientConfig: opts.TLS}
	}
	c := &etcdCluster{placement: p, attach: opts, http: hc}
	if _, err := c.Leader(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("bench: attach %v: %w", opts.Endpoints, err)
	}
	return c, nil
}

type etcdCluster struct {
	tb *testbed.EtcdCluster // nil when attached
	placement
	attach AttachOptions // TLS and credentials; zero on the test bed
	http   *http.Client

	statusMu  sync.Mutex
	statusCli []*clientv3.Client // external: one plain client per endpoint
}

func (c *etcdCluster) Faults() Faults {
	if c.tb == nil {
		return nil
	}
	return c.tb
}

func (c *etcdCluster) Leader(ctx context.Context) (int, error) {
	if c.tb != nil {
		return c.tb.Leader(ctx)
	}
	sts := make([]*pb.StatusResponse, len(c.endpoints))
	for i := range c.endpoints {
		sts[i], _ = c.status(ctx, i) // nil: no answer, no vote
	}
	if leader, ok := testbed.MajorityLeader(sts, len(c.endpoints)); ok {
		for i, st := range sts {
			if st != nil && st.Header.MemberId == leader {
				return i, nil
			}
		}
	}
	return -1, testbed.ErrNoLeader
}

func (c *etcdCluster) status(ctx context.Context, i int) (*pb.StatusResponse, error) {
	c.statusMu.Lock()
	if c.statusCli == nil {
		c.statusCli = make([]*clientv3.Client, len(c.endpoints))
	}
	cli := c.statusCli[i]
	if cli == nil {
		var err error
		cli, err = clientv3.New(clientv3.Config{Endpoints: []string{c.endpoints[i]}, Logger: zap.NewNop(),
			TLS: c.attach.TLS, Username: c.attach.Username, Password: c.attach.Password})
		if err != nil {
			c.statusMu.Unlock()
			return nil, err
		}
		c.statusCli[i] = cli
	}
	c.statusMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return pb.NewMaintenanceClient(cli.ActiveConnection()).Status(ctx, &pb.StatusRequest{})
}

func (c *etcdCluster) Served(ctx context.Context) ([]Served, error) {
	return servedByMember(len(c.endpoints), func(i int) (Served, error) {
		if c.tb != nil {
			return c.tb.Served(ctx, i)
		}
		n, err := testbed.FetchGRPCCounts(ctx, c.http, c.endpoints[i])
		if err != nil {
			return Served{}, err
		}
		return testbed.ServedFromGRPC(n), nil
	})
}

func (c *etcdCluster) ServerCPU() []time.Duration { return membersCPU(c.bed()) }

func (c *etcdCluster) bed() bedCPU {
	if c.tb == nil {
		return nil // not a nil *testbed cluster in an interface
	}
	return c.tb
}

func (c *etcdCluster) Traffic() (testbed.TrafficCounts, error) {
	if c.tb == nil {
		return testbed.TrafficCounts{}, ErrNeedsTestbed
	}
	return c.tb.Traffic()
}

func (c *etcdCluster) Close() error {
	c.statusMu.Lock()
	for _, cli := range c.statusCli {
		if cli != nil {
			cli.Close()
		}
	}
	c.statusMu.Unlock()
	c.http.CloseIdleConnections()
	if c.tb != nil {
		return c.tb.Close()
	}
	return nil
}

func (c *etcdCluster) Connect(ctx context.Context, policy string, conns int) (Client, error) {
	switch policy {
	case Stock:
		cli, err := clientv3.New(c.clientConfig(c.endpoints))
		if err != nil {
			return nil, err
		}
		return &stockClient{clis: []*clientv3.Client{cli}}, nil
	case Pinned:
		sc := &stockClient{pinned: true}
		for k := range conns * len(c.endpoints) {
			cli, err := clientv3.New(c.clientConfig([]string{c.endpoints[k%len(c.endpoints)]}))
			if err != nil {
				sc.Close()
				return nil, err
			}
			sc.clis = append(sc.clis, cli)
		}
		return sc, nil
	}
	// The routed client waits for its probes, so that a trial starts with
	// the leader known; the warm-up makes every client's connections.
	opts := []etcd.Option{etcd.WithPolicy(routedPolicy(policy)), etcd.WithConnsPerMember(conns), etcd.WithRouterConfig(routerTune(policy)),
		etcd.WithConnectTimeout(c.clientConfig(nil).DialTimeout)}
	if zones, ok := c.zonesByEndpoint(); ok {
		opts = append(opts, etcd.WithZones(c.clientZone, zones))
	}
	cli, pin, err := connectPinned(ctx, policy, c, c.tb != nil, func() (*etcdtest.Client, error) { return etcdtest.Connect(c.clientConfig(c.endpoints), opts...) })
	if err != nil {
		return nil, err
	}
	return &etcdClient{Client: cli, pin: pin}, nil
}

// etcdClient is the routed client (etcdtest's adapter), its writes pinned
// where the policy says (Oracle, StaticLeader).
type etcdClient struct {
	*etcdtest.Client
	pin *writePin
}

func (c *etcdClient) Write(ctx context.Context, key string, value []byte) error {
	return c.Client.Write(c.pin.route(ctx, etcd.WithMember), key, value)
}

// ErrorClass implements the fleet's errorClasser.
func (c *etcdClient) ErrorClass(err error) string { return etcdErrorClass(err) }

// HoldStreams implements the fleet's streamHolder.
func (c *etcdClient) HoldStreams(ctx context.Context, key string) (func(), error) {
	return holdEtcdStreams(ctx, c.Client.Client.Client, key)
}

// HoldStreams implements the fleet's streamHolder.
func (c *stockClient) HoldStreams(ctx context.Context, key string) (func(), error) {
	return holdEtcdStreams(ctx, c.clis[0], key)
}

// holdEtcdStreams opens what an idle service holds: a watch on key and the
// keep-alive of a 60 s lease (etcd's concurrency sessions' default TTL).
func holdEtcdStreams(ctx context.Context, cli *clientv3.Client, key string) (func(), error) {
	sctx, cancel := context.WithCancel(ctx)
	lease, err := cli.Grant(sctx, 60)
	if err != nil {
		cancel()
		return nil, err
	}
	ka, err := cli.KeepAlive(sctx, lease.ID)
	if err != nil {
		cancel()
		return nil, err
	}
	wch := cli.Watch(sctx, key)
	var drains sync.WaitGroup
	drains.Go(func() {
		for range ka {
		}
	})
	drains.Go(func() {
		for range wch {
		}
	})
	return func() { cancel(); drains.Wait() }, nil
}

// ErrorClass implements the fleet's errorClasser.
func (c *stockClient) ErrorClass(err error) string { return etcdErrorClass(err) }

// etcdErrorClass names an etcd error by its gRPC code (etcd's rpctypes
// errors carry theirs), "" for none.
func etcdErrorClass(err error) string {
	switch {
	case errors.Is(err, etcd.ErrUnreachable):
		return "unreachable"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code().String()
	}
	if st, ok := status.FromError(err); ok && st.Code() != codes.OK {
		return st.Code().String()
	}
	return ""
}

func (c *etcdClient) Close() error {
	c.pin.close()
	return c.Client.Close()
}

// clientConfig is the one configuration every client gets, routed or not:
// an attached cluster's TLS and credentials included.
func (c *etcdCluster) clientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop(), DialTimeout: 10 * time.Second,
		TLS: c.attach.TLS, Username: c.attach.Username, Password: c.attach.Password}
}

// serverVersions implements versionTeller: each member's Status.
func (c *etcdCluster) serverVersions(ctx context.Context) []string {
	out := make([]string, len(c.endpoints))
	var wg sync.WaitGroup
	for i := range c.endpoints {
		wg.Go(func() {
			var st *pb.StatusResponse
			var err error
			if c.tb != nil {
				st, err = c.tb.Status(ctx, i) // its direct port: no client traffic through the proxies
			} else {
				st, err = c.status(ctx, i)
			}
			if err == nil {
				out[i] = st.Version
			}
		})
	}
	wg.Wait()
	return out
}

// claimKeys implements keyStore: one transaction writes the run's first
// key if and only if no key is under the prefix (a compare over a range
// with no key holds; etcd compares every key of a range), so that of two
// runs given one prefix the second finds the first's key.
func (c *etcdCluster) claimKeys(ctx context.Context, prefix string) error {
	cli, err := clientv3.New(c.clientConfig(c.endpoints))
	if err != nil {
		return err
	}
	defer cli.Close()
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(prefix), "=", 0).WithPrefix()).
		Then(clientv3.OpPut(keySpace(prefix).key(0), "")).
		Commit()
	if err != nil {
		return fmt.Errorf("bench: claiming the keys under %q: %w", prefix, err)
	}
	if !resp.Succeeded {
		return ErrPrefixInUse
	}
	return nil
}

// deleteKeys implements keyStore: one DeleteRange through a plain client.
func (c *etcdCluster) deleteKeys(ctx context.Context, prefix string) (int64, error) {
	cli, err := clientv3.New(c.clientConfig(c.endpoints))
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	resp, err := cli.Delete(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	return resp.Deleted, nil
}

// stockClient is unmodified clientv3: one client (Stock), or one per
// connection with each worker on one of them (Pinned).
type stockClient struct {
	clis   []*clientv3.Client
	pinned bool
}

func (c *stockClient) client(ctx context.Context) *clientv3.Client {
	if !c.pinned {
		return c.clis[0]
	}
	return c.clis[WorkerOf(ctx)%len(c.clis)]
}

func (c *stockClient) Write(ctx context.Context, key string, value []byte) error {
	_, err := c.client(ctx).Put(ctx, key, string(value))
	return err
}

func (c *stockClient) Read(ctx context.Context, key, end string) error {
	var err error
	if end == "" {
		_, err = c.client(ctx).Get(ctx, key)
	} else {
		_, err = c.client(ctx).Get(ctx, key, clientv3.WithRange(end))
	}
	return err
}

// Stats is empty: no router; the members' own counts say where calls went.
func (c *stockClient) Stats() router.Stats { return router.Stats{} }

func (c *stockClient) Close() error {
	var errs []error
	for _, cli := range c.clis {
		errs = append(errs, cli.Close())
	}
	return errors.Join(errs...)
}

// ProbeRequests is the Status RPCs the members answered so far, by their
// own /metrics: the routed clients' probes (and the bench's own leader
// look-ups, which go through the test bed's direct ports only when
// attached: none during a fleet's window).
func (c *etcdCluster) ProbeRequests(ctx context.Context) (uint64, error) {
	var n uint64
	for i, ep := range c.endpoints {
		var counts map[string]uint64
		var err error
		if c.tb != nil {
			if c.tb.Member(i).PID() == 0 {
				continue
			}
			counts, err = c.tb.GRPCCounts(ctx, i)
		} else {
			counts, err = testbed.FetchGRPCCounts(ctx, c.http, ep)
		}
		if err != nil {
			return 0, err
		}
		n += counts["etcdserverpb.Maintenance/Status"]
	}
	return n, nil
}
