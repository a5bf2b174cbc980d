package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/mod/semver"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
	"github.com/oproute/oproute/tools/testbed/proxy"
)

func newClient(t *testing.T, c *testbed.EtcdCluster, opts ...etcd.Option) *etcd.Client {
	t.Helper()
	cli, err := etcd.New(clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop(), DialTimeout: 5 * time.Second, TLS: c.ClientTLS()}, append([]etcd.Option{etcd.WithConnectTimeout(5 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	waitReady(t, cli)
	return cli
}

// waitReady waits until the leader is known and every member answered a
// probe, which needs a ready pooled connection to it.
func waitReady(t *testing.T, cli *etcd.Client) {
	t.Helper()
	testutil.PollWhy(t, 10*time.Second, "client ready", func() (bool, string) {
		return allProbed(cli) && cli.Stats().Leader != "", fmt.Sprintf("%+v", cli.Stats())
	})
}

// observedClient is a client of c whose zap logger records what it logs at
// level and above; unlike newClient it does not wait for the client to be
// ready, so start-up is observed too.
func observedClient(t *testing.T, c *testbed.EtcdCluster, level zapcore.Level) (*etcd.Client, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(level)
	cli, err := etcd.New(clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.New(core), DialTimeout: 5 * time.Second}, etcd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, logs
}

// allProbed reports whether every member of cli's router has answered a
// probe, which needs a ready pooled connection to it.
func allProbed(cli *etcd.Client) bool {
	for _, m := range cli.Stats().Members {
		if !m.ProbeOK {
			return false
		}
	}
	return true
}

// TestWholeAPIThroughRouter exercises every clientv3 API group through the
// routed client, on a flat topology.
func TestWholeAPIThroughRouter(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: testbed.FlatTopology(3)})
	cli := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// KV and Txn.
	put, err := cli.Put(ctx, "api/a", "1")
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Get(ctx, "api/a"); err != nil || string(resp.Kvs[0].Value) != "1" {
		t.Fatalf("Get: %v %v", resp, err)
	}
	// A serializable read is served by a member from what it has applied,
	// which may be behind the Put (a follower applies after it acks).
	if resp, err := cli.Get(ctx, "api/a", clientv3.WithSerializable()); err != nil || len(resp.Kvs) != 1 && resp.Header.Revision >= put.Header.Revision {
		t.Fatalf("serializable Get: %v %v", resp, err)
	}
	txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("api/a"), "=", "1")).Then(clientv3.OpPut("api/b", "2")).Commit()
	if err != nil || !txn.Succeeded {
		t.Fatalf("Txn: %v %v", txn, err)
	}
	if _, err := cli.Delete(ctx, "api/b"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
		t.Fatal(err)
	}

	// Watch: a stream, picked once.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cli.Watch(wctx, "api/w")
	// The watch is registered once its creation response arrives; the
	// progress request makes that observable without sleeping.
	if err := cli.RequestProgress(wctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "api/w", "x"); err != nil {
		t.Fatal(err)
	}
	for ev := range wch {
		if len(ev.Events) > 0 {
			if string(ev.Events[0].Kv.Value) != "x" {
				t.Fatalf("watch event %v", ev.Events[0])
			}
			break
		}
	}

	// Lease: grant, keep alive (a stream), attach, revoke.
	lease, err := cli.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	ka, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	if resp := <-ka; resp == nil || resp.ID != lease.ID {
		t.Fatalf("keep-alive: %v", resp)
	}
	if _, err := cli.Put(ctx, "api/leased", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if ttl, err := cli.TimeToLive(ctx, lease.ID); err != nil || ttl.TTL <= 0 {
		t.Fatalf("TimeToLive: %v %v", ttl, err)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	if resp, _ := cli.Get(ctx, "api/leased"); len(resp.Kvs) != 0 {
		t.Fatal("revoking the lease did not delete its key")
	}

	// Cluster and Maintenance.
	ml, err := cli.MemberList(ctx)
	if err != nil || len(ml.Members) != 3 {
		t.Fatalf("MemberList: %v %v", ml, err)
	}
	if st, err := cli.Status(ctx, c.Endpoints()[1]); err != nil || st.Header.MemberId != c.Member(1).ID() {
		t.Fatalf("Status of m1: %v %v", st, err)
	}
	if _, err := cli.AlarmList(ctx); err != nil {
		t.Fatal(err)
	}
	// MoveLeader must reach the leader; stock round robin sends it to a
	// follower two times in three and fails.
	leader, _ := c.Leader(ctx)
	to := (leader + 1) % 3
	if _, err := cli.MoveLeader(ctx, c.Member(to).ID()); err != nil {
		t.Fatalf("MoveLeader: %v", err)
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}

	// Auth (every call goes through raft, so to the leader).
	if _, err := cli.UserAdd(ctx, "alice", "secret"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.RoleAdd(ctx, "reader"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "alice", "reader"); err != nil {
		t.Fatal(err)
	}
	if u, err := cli.UserGet(ctx, "alice"); err != nil || len(u.Roles) != 1 {
		t.Fatalf("UserGet: %v %v", u, err)
	}

	st := cli.Stats()
	var streams uint64
	for _, m := range st.Members {
		streams += m.Ops[router.Stream]
	}
	if streams < 2 {
		t.Fatalf("watch and keep-alive streams not routed as streams: %+v", st)
	}
}

func TestTLSReachesProbes(t *testing.T) {
	testutil.MostlyWaits(t)
	testutil.NeedsServers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := testbed.StartEtcd(ctx, testbed.EtcdOptions{Topology: testbed.FlatTopology(3), ClientTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Probes answer only if the TLS configuration reached them.
	cli := newClient(t, c)
	if _, err := cli.Put(ctx, "tls", "v"); err != nil {
		t.Fatal(err)
	}
	// newClient waited for every probe to answer: over TLS.
	// Without the CA nothing answers. New returns at once all the same,
	// as clientv3.New does, and the first call fails as stock's does;
	// with WithConnectTimeout New itself says so.
	bad := c.ClientTLS()
	bad.RootCAs = nil
	badCfg := clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop(), DialTimeout: 10 * time.Second, TLS: bad}
	stock, err := clientv3.New(badCfg)
	if err != nil {
		t.Fatalf("stock New with an untrusted certificate: %v, want nil", err)
	}
	defer stock.Close()
	routed, err := etcd.New(badCfg)
	if err != nil {
		t.Fatalf("New with an untrusted certificate: %v, want nil as stock's", err)
	}
	defer routed.Close()
	for name, kv := range map[string]clientv3.KV{"stock": stock, "routed": routed} {
		callCtx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := kv.Get(callCtx, "tls")
		cancel()
		if err == nil {
			t.Fatalf("%s: a Get with an untrusted certificate succeeded", name)
		}
	}
	if _, err := etcd.New(badCfg, etcd.WithConnectTimeout(time.Second)); !errors.Is(err, router.ErrUnreachable) {
		t.Fatalf("untrusted certificate, WithConnectTimeout: err = %v, want ErrUnreachable", err)
	}
}

// TestProbesReuseConnections: probing every 250 ms opens no connection of
// its own: the members see only the pool's connections, while their own
// counts show the Status calls.
func TestProbesReuseConnections(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: testbed.FlatTopology(3)})
	ctx := context.Background()
	before := make([]uint64, 3)
	for i := range before {
		n, err := c.GRPCCounts(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		before[i] = n["etcdserverpb.Maintenance/Status"]
	}
	conns := make([]uint64, 3)
	for i := range conns {
		conns[i] = c.Member(i).ClientConnections()
	}
	// Probing every round (a settled client probes every 10 s): 12 probes
	// a member in 3 s.
	everyRound := etcd.WithRouterConfig(func(rc *router.Config) { rc.StableProbeInterval = router.DefaultProbeInterval })
	newClient(t, c, etcd.WithConnsPerMember(2), everyRound)
	deadline := time.Now().Add(10 * time.Second)
	for i := range 3 {
		for {
			n, err := c.GRPCCounts(ctx, i)
			if err != nil {
				t.Fatal(err)
			}
			if n["etcdserverpb.Maintenance/Status"]-before[i] >= 12 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("m%d answered only %d probes", i, n["etcdserverpb.Maintenance/Status"]-before[i])
			}
			time.Sleep(50 * time.Millisecond)
		}
		if opened := c.Member(i).ClientConnections() - conns[i]; opened != 2 {
			t.Errorf("m%d: the client opened %d connections for 12+ probes, want its pool of 2", i, opened)
		}
	}
}

func TestOverridesAndZonePreference(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: testbed.DefaultTopology(3)})
	eps := c.Endpoints()
	zones := map[string]string{eps[0]: "a", eps[1]: "a", eps[2]: "b"}
	cli := newClient(t, c, etcd.WithZones("a", zones))
	ctx := context.Background()
	count := func() []uint64 { return served(t, c, "etcdserverpb.KV/Range") }
	leader, _ := c.Leader(ctx)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		opts []clientv3.OpOption
		want func(d [3]uint64) bool
	}{
		{"WithMember(m2)", etcd.WithMember(ctx, eps[2]), nil, func(d [3]uint64) bool { return d[2] == 60 }},
		{"WithLeader", etcd.WithLeader(ctx), nil, func(d [3]uint64) bool { return d[leader] == 60 }},
		// All in zone a; split between its two members (30/30 when all is
		// quiet, but one can leave the pool for a while on a busy machine).
		{"serializable reads stay in zone a", ctx, []clientv3.OpOption{clientv3.WithSerializable()}, func(d [3]uint64) bool { return d[2] == 0 && d[0]+d[1] == 60 }},
	} {
		before := count()
		for i := range 60 {
			if _, err := cli.Get(tc.ctx, fmt.Sprint("z", i), tc.opts...); err != nil {
				t.Fatal(err)
			}
		}
		after := count()
		d := [3]uint64{after[0] - before[0], after[1] - before[1], after[2] - before[2]}
		if !tc.want(d) {
			t.Errorf("%s: Ranges served per member %v; router: %+v", tc.name, d, cli.Stats().Members)
		}
	}
	if _, err := cli.Get(etcd.WithMember(ctx, "http://127.0.0.1:1"), "k"); err == nil {
		t.Fatal("WithMember of an unknown endpoint succeeded")
	}
}

// TestCredentialsApplyEverywhere enables auth: with the right password the
// routed client writes (on the leader), reads and probes; so does a user
// whose one role reads and writes its own prefix alone, the least the
// router needs (etcd lets any authenticated user call Status, but some
// releases: statusNeedsRoot). Without
// credentials calls fail with etcd's error and the client tells, once,
// that its probes are refused; with a wrong password New fails, as
// clientv3.New does.
func TestCredentialsApplyEverywhere(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: testbed.FlatTopology(3)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := newClient(t, c)
	leader, err := c.Leader(ctx) // asked before auth is on: Status then needs a user
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "app"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "app", "app/", clientv3.GetPrefixRangeEnd("app/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := admin.UserAdd(ctx, "app", "apppw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "app", "app"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	cfg := clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop(), DialTimeout: 5 * time.Second, Username: "root", Password: "rootpw"}
	cli, err := etcd.New(cfg, etcd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	before := cli.Stats().Members[leader].Ops[router.Write]
	if _, err := cli.Put(ctx, "auth/k", "v"); err != nil {
		t.Fatalf("Put with credentials: %v", err)
	}
	if _, err := cli.Get(ctx, "auth/k"); err != nil {
		t.Fatalf("Get with credentials: %v", err)
	}
	// Under auth a probe answers only with credentials: the leader is
	// known only if they reached the probes.
	if st := cli.Stats(); st.Leader != c.Endpoints()[leader] || st.Members[leader].Ops[router.Write] != before+1 {
		t.Fatalf("write not routed to the leader under auth: %+v", st)
	}
	// The least privileged user: its prefix only, and routed as root is,
	// but by the servers that serve Status to the root role alone: there
	// the client says so once, and its writes still succeed (round robin,
	// forwarded by the followers).
	st, err := cli.Status(ctx, c.Endpoints()[leader])
	if err != nil {
		t.Fatal(err)
	}
	rootOnly := statusNeedsRoot("v" + st.Version)
	var appRefused atomic.Int32
	appCfg := cfg
	appCfg.Username, appCfg.Password = "app", "apppw"
	app, err := etcd.New(appCfg, etcd.WithConnectTimeout(5*time.Second), etcd.WithRouterConfig(func(rc *router.Config) {
		rc.OnEvent = func(e router.Event) {
			if e.Kind == etcd.EventStatusRefused {
				appRefused.Add(1)
			}
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	before = app.Stats().Members[leader].Ops[router.Write]
	if _, err := app.Put(ctx, "app/k", "v"); err != nil {
		t.Fatalf("Put in the user's prefix: %v", err)
	}
	if rootOnly {
		t.Logf("etcd %s serves Status to the root role only", st.Version)
		if n := appRefused.Load(); n != 1 {
			t.Errorf("the least privileged user's client told %d %s events, want one", n, etcd.EventStatusRefused)
		}
	} else if st := app.Stats(); st.Leader != c.Endpoints()[leader] || st.Members[leader].Ops[router.Write] != before+1 {
		t.Fatalf("the least privileged user's write not routed to the leader: %+v", st)
	}
	if _, err := app.Put(ctx, "auth/k", "v"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("Put outside the user's prefix: %v, want rpctypes.ErrPermissionDenied", err)
	}
	// Without credentials: New succeeds (every member answered, refusing),
	// calls fail with etcd's own error, as with clientv3, and the client
	// says once that its probes are refused.
	var refused atomic.Int32
	anon, err := etcd.New(clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop(), DialTimeout: 5 * time.Second},
		etcd.WithConnectTimeout(5*time.Second), etcd.WithRouterConfig(func(rc *router.Config) {
			rc.OnEvent = func(e router.Event) {
				if e.Kind == etcd.EventStatusRefused {
					refused.Add(1)
				}
			}
		}))
	if err != nil {
		t.Fatalf("New without credentials: %v", err)
	}
	defer anon.Close()
	if _, err := anon.Get(ctx, "auth/k"); !errors.Is(err, rpctypes.ErrUserEmpty) {
		t.Fatalf("an unauthenticated Get: %v, want rpctypes.ErrUserEmpty", err)
	}
	if n := refused.Load(); n != 1 {
		t.Errorf("%d %s events, want one", n, etcd.EventStatusRefused)
	}
	cfg.Password = "wrong"
	if bad, err := etcd.New(cfg); err == nil {
		bad.Close()
		t.Fatal("New with a wrong password succeeded")
	}
}

// statusNeedsRoot reports whether an etcd server of version, with auth
// enabled, serves Maintenance.Status to the root role only: from v3.6.0
// (etcd-io/etcd#14663, which asked admin rights of every maintenance RPC)
// and v3.5.28 (CVE-2026-33413's fix, etcd-io/etcd#21663) until the
// releases that serve it to any authenticated user again
// (etcd-io/etcd#21666): v3.6.12 and v3.5.32, read in the modules' source.
func statusNeedsRoot(version string) bool {
	in := func(from, until string) bool {
		return semver.Compare(version, from) >= 0 && semver.Compare(version, until) < 0
	}
	return in("v3.5.28", "v3.5.32") || in("v3.6.0", "v3.6.12")
}

// TestFleetStreams: a fleet of clients puts every keep-alive stream on the
// leader (a follower only forwards keep-alives) and spreads its watch
// streams over the read pool (each client's rotation starts at a random
// member), counted by the members themselves. With 16 clients, all on one
// member by chance is about 1 in 30,000 with two members in the pool and 1
// in 14 million with three (9 clients once put all nine on one member beside
// a busy core, which two in the pool make 1 in 256).
func TestFleetStreams(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	started := func() (keepAlives, watches []uint64) {
		for i := range c.Size() {
			n, err := c.GRPCStarted(ctx, i)
			if err != nil {
				t.Fatal(err)
			}
			keepAlives = append(keepAlives, n["etcdserverpb.Lease/LeaseKeepAlive"])
			watches = append(watches, n["etcdserverpb.Watch/Watch"])
		}
		return
	}
	ka0, w0 := started()
	const fleet = 16
	pools := make([][]int, fleet) // each client's read pool when it watched
	for k := range fleet {
		cli := newClient(t, c)
		s, err := concurrency.NewSession(cli.Client, concurrency.WithTTL(5))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for i, m := range cli.Stats().Members {
			if m.Reachable && !m.Ejected {
				pools[k] = append(pools[k], i)
			}
		}
		cli.Watch(ctx, fmt.Sprintf("fleet/%d", k))
	}
	var ka, w []uint64
	deadline := time.Now().Add(10 * time.Second)
	for {
		ka1, w1 := started()
		ka, w = make([]uint64, len(ka1)), make([]uint64, len(w1))
		var nka, nw uint64
		for i := range ka1 {
			ka[i], w[i] = ka1[i]-ka0[i], w1[i]-w0[i]
			nka, nw = nka+ka[i], nw+w[i]
		}
		if nka >= fleet && nw >= fleet {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("streams not all open after 10 s: keep-alives %v, watches %v", ka, w)
		}
		time.Sleep(50 * time.Millisecond)
	}
	sizes := map[int]int{} // clients by the size of their read pool when they watched
	for _, p := range pools {
		sizes[len(p)]++
	}
	t.Logf("server side: keep-alive streams per member %v (leader m%d), watch streams %v; clients by read-pool size: %v", ka, leader, w, sizes)
	for i, n := range ka {
		if i != leader && n > 0 {
			t.Errorf("m%d (a follower) holds %d keep-alive streams: %v", i, n, ka)
		}
	}
	used := 0
	for _, n := range w {
		if n > 0 {
			used++
		}
	}
	if used < 2 {
		t.Errorf("%d clients' watch streams all on one member: %v; the clients' read pools when they watched: %v", fleet, w, pools)
	}
}

// Probes of a member without a ready connection (at start-up, or while it
// is down) fail quietly: they used to go through clientv3's retry
// interceptor, which logged every attempt at warn level ("retrying of
// unary invoker failed … Maintenance/Status … has no ready connection").
// A probe in flight when its member dies still fails through it, and that
// one is logged.
func TestProbesDoNotWarnWhileConnecting(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	cli, logs := observedClient(t, c, zap.WarnLevel)
	probeWarnings := func() (all, notReady int) {
		for _, e := range logs.All() {
			if ctx := fmt.Sprint(e.ContextMap()); strings.Contains(ctx, "Maintenance/Status") {
				all++
				if strings.Contains(ctx, "no ready connection") {
					notReady++
				}
			}
		}
		return all, notReady
	}
	testutil.Poll(t, 10*time.Second, "every member probed", func() bool { return allProbed(cli) })
	if all, _ := probeWarnings(); all > 0 {
		t.Errorf("%d probe warnings at start-up", all)
	}
	if err := c.Kill(2); err != nil { // a member down: its connection is never ready again
		t.Fatal(err)
	}
	testutil.Poll(t, 10*time.Second, "the killed member unreachable", func() bool { return !cli.Stats().Members[2].Reachable })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 20 {
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
	}
	all, notReady := probeWarnings()
	t.Logf("%d warnings logged, %d about probes, %d of them 'no ready connection'", logs.Len(), all, notReady)
	if notReady > 0 || all > 1 {
		t.Errorf("%d probe warnings (%d 'no ready connection'), want at most the one in flight when the member died", all, notReady)
	}
}

// The client's metrics agree with each member's own /metrics, and a
// member that goes away shows in the metrics and in one warning on the
// client's zap logger.
func TestMetricsAndEvents(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	cli, logs := observedClient(t, c, zap.InfoLevel)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(cli.Collector()); err != nil {
		t.Fatal(err)
	}
	if problems, err := promtestutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eps := c.Endpoints()
	ranges := func() []uint64 { return served(t, c, "etcdserverpb.KV/Range") }
	before := ranges()
	for range 300 {
		if _, err := cli.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	after := ranges()
	for i, ep := range eps {
		routed := testutil.Metric(t, reg, "oproute_operations_total", "member", ep, "class", "linearizable_read", "outcome", "ok")
		served := float64(after[i] - before[i])
		t.Logf("m%d: %v reads in the metrics, %v Ranges served by its /metrics", i, routed, served)
		if routed != served {
			t.Errorf("m%d: metrics say %v reads, the member served %v", i, routed, served)
		}
	}
	// Each answered read is in its member's histogram (hybrid spreads the
	// 300 evenly, unless the machine made a member look slow for a while).
	ok1 := testutil.Metric(t, reg, "oproute_operations_total", "member", eps[1], "class", "linearizable_read", "outcome", "ok")
	if h := testutil.Metric(t, reg, "oproute_read_latency_seconds", "member", eps[1]); h != ok1 || h == 0 {
		t.Errorf("m1's read latency histogram holds %v reads, want the %v it answered", h, ok1)
	}

	// Counted from the kill: a probe of m2 that timed out on a loaded
	// machine before it tells a pair of its own.
	unreachable := func() int {
		n := 0
		for _, e := range logs.FilterMessage(router.EventUnreachable).All() {
			if e.ContextMap()["member"] == eps[2] && e.Level == zap.WarnLevel {
				n++
			}
		}
		return n
	}
	unreachable0 := unreachable()
	if err := c.Kill(2); err != nil {
		t.Fatal(err)
	}
	testutil.Poll(t, 10*time.Second, "the killed member down in the metrics", func() bool {
		return testutil.Metric(t, reg, "oproute_member_up", "member", eps[2]) == 0
	})
	if n := unreachable() - unreachable0; n != 1 {
		t.Errorf("%d %s warnings for the killed member, want 1: %v", n, router.EventUnreachable, logs.All())
	}
}

// The router follows clientv3's endpoints: SetEndpoints adding one makes
// it a member that serves reads after its first good probe; removing the
// leader's endpoint retires it — checked by its own /metrics — while
// writes go on through the others; Sync (MemberList) brings back the
// members the cluster advertises.
func TestEndpointsFollowed(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	eps := c.Endpoints()
	cli, err := etcd.New(clientv3.Config{Endpoints: eps[:2], Logger: zap.NewNop(), DialTimeout: 5 * time.Second}, etcd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	counts := func(method string) []uint64 { return served(t, c, method) }
	live := func() map[string]bool {
		m := map[string]bool{}
		for _, ms := range cli.Stats().Members {
			if !ms.Retired && ms.Reachable && ms.ProbeOK {
				m[ms.Member.Addr] = true
			}
		}
		return m
	}
	cli.SetEndpoints(eps...)
	testutil.Poll(t, 5*time.Second, "the added endpoint probed", func() bool { return len(live()) == 3 })
	before := counts("etcdserverpb.KV/Range")
	for range 300 {
		if _, err := cli.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	after := counts("etcdserverpb.KV/Range")
	// A third when all is quiet; on a busy machine a member can leave the
	// pool for a second of the burst: at least a tenth shows it serves.
	if n := after[2] - before[2]; n < 30 {
		t.Errorf("the added member served %d of 300 reads, want a third (at least a tenth); router: %+v", n, cli.Stats().Members)
	}

	// A watch on m0, the member about to leave the list: it must move.
	wch := cli.Watch(etcd.WithPreferredMember(ctx, eps[0]), "w")
	openWatches := func(i int) uint64 {
		started, err := c.GRPCStarted(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		return started["etcdserverpb.Watch/Watch"] - counts("etcdserverpb.Watch/Watch")[i]
	}
	testutil.Poll(t, 5*time.Second, "the watch open on m0", func() bool { return openWatches(0) == 1 })

	cli.SetEndpoints(eps[1:]...) // m0, the leader, leaves the list
	testutil.Poll(t, 5*time.Second, "the removed endpoint retired", func() bool { return !live()["127.0.0.1:"+strings.Split(eps[0], ":")[2]] && len(live()) == 2 })
	testutil.Poll(t, 5*time.Second, "the watch moved off the removed endpoint", func() bool { return openWatches(0) == 0 && openWatches(1)+openWatches(2) == 1 })
	if _, err := cli.Put(ctx, "w", "after"); err != nil {
		t.Fatal(err)
	}
	if resp := testutil.Receive(t, wch, 3*time.Second, "the moved watch"); len(resp.Events) != 1 || string(resp.Events[0].Kv.Value) != "after" {
		t.Fatalf("moved watch delivered %+v, want the put of %q", resp, "after")
	}
	beforeR, beforeP := counts("etcdserverpb.KV/Range"), counts("etcdserverpb.KV/Put")
	for n := range 100 {
		if _, err := cli.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, "k", fmt.Sprint(n)); err != nil {
			t.Fatalf("write %d without the leader's endpoint: %v", n, err)
		}
	}
	afterR, afterP := counts("etcdserverpb.KV/Range"), counts("etcdserverpb.KV/Put")
	if afterR[0] != beforeR[0] || afterP[0] != beforeP[0] {
		t.Errorf("the removed member received %d reads and %d writes", afterR[0]-beforeR[0], afterP[0]-beforeP[0])
	}

	if err := cli.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Poll(t, 5*time.Second, "every advertised member back after Sync", func() bool { return len(live()) == 3 })
	t.Logf("endpoints after Sync: %v", cli.Endpoints())
}

// served returns how many calls of method (e.g. "etcdserverpb.KV/Range")
// each member has served, by its own /metrics.
func served(t *testing.T, c *testbed.EtcdCluster, method string) []uint64 {
	t.Helper()
	out := make([]uint64, c.Size())
	for i := range out {
		n, err := c.GRPCCounts(context.Background(), i)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = n[method]
	}
	return out
}

// TestUnixEndpoints: members reached over unix sockets, in both of
// clientv3's spellings ("unix:///abs/path", "unix:/abs/path"), are the
// router's members: probed, the leader found, reads spread over all three
// by their own /metrics.
func TestUnixEndpoints(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	dir := t.TempDir()
	var eps []string
	for i, ep := range c.Endpoints() {
		path := filepath.Join(dir, fmt.Sprintf("m%d.sock", i))
		p, err := proxy.ListenUnix(path, proxy.Config{Target: strings.TrimPrefix(ep, "http://")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		if i%2 == 0 {
			eps = append(eps, "unix://"+path)
		} else {
			eps = append(eps, "unix:"+path)
		}
	}
	cli, err := etcd.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop(), DialTimeout: 5 * time.Second}, etcd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	testutil.Poll(t, 5*time.Second, "every unix member probed and the leader known", func() bool {
		return allProbed(cli) && cli.Stats().Leader == eps[0]
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	expectReadsSpread(ctx, t, c, cli, "over unix sockets")
}

// expectReadsSpread reads 300 times through cli and fails unless each of
// c's three members served some of them by its own /metrics: a third when
// all is quiet, at least a tenth (a member can leave the pool for a second
// of the burst on a busy machine).
func expectReadsSpread(ctx context.Context, t *testing.T, c *testbed.EtcdCluster, cli *etcd.Client, when string) {
	t.Helper()
	before := served(t, c, "etcdserverpb.KV/Range")
	for range 300 {
		if _, err := cli.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	after := served(t, c, "etcdserverpb.KV/Range")
	for i := range after {
		if n := after[i] - before[i]; n < 30 {
			t.Errorf("%s: m%d served %d of 300 reads, want a third (at least a tenth) (%v → %v); router: %+v", when, i, n, before, after, cli.Stats().Members)
		}
	}
}

// TestAdvertisedURLsDiffer: endpoints configured under another spelling
// than the members advertise ("localhost:port" for
// "http://127.0.0.1:port"): before and after Sync, which replaces them with
// the advertised URLs, every member is a router member — probed, the
// leader known — and reads spread over all three by their own /metrics.
func TestAdvertisedURLsDiffer(t *testing.T) {
	testutil.MostlyWaits(t)
	// Flat: no member is farther than the others, so all three share the
	// reads evenly.
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: testbed.FlatTopology(3)})
	var eps []string
	for _, ep := range c.Endpoints() {
		eps = append(eps, strings.Replace(strings.TrimPrefix(ep, "http://"), "127.0.0.1", "localhost", 1))
	}
	cli, err := etcd.New(clientv3.Config{Endpoints: eps, Logger: zap.NewNop(), DialTimeout: 5 * time.Second}, etcd.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spread := func(when string) {
		t.Helper()
		testutil.Poll(t, 5*time.Second, when+": every member probed and the leader known", func() bool {
			st, live := cli.Stats(), 0
			for _, m := range st.Members {
				if !m.Retired && m.ProbeOK {
					live++
				}
			}
			return live == 3 && st.Leader != ""
		})
		expectReadsSpread(ctx, t, c, cli, when)
	}
	spread("as configured")
	if err := cli.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Poll(t, 5*time.Second, "the advertised URLs followed", func() bool {
		for _, m := range cli.Stats().Members {
			if !m.Retired && strings.HasPrefix(m.Member.Addr, "localhost") {
				return false
			}
		}
		return true
	})
	t.Logf("endpoints after Sync: %v", cli.Endpoints())
	spread("after Sync")
}
