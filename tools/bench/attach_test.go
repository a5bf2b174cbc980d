package bench

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// TestAttachPlacement: an attached cluster's zones reach the routed
// clients when the client's zone and every endpoint's are given, and are
// refused when they do not place every endpoint.
func TestAttachPlacement(t *testing.T) {
	eps := []string{"a:2379", "b:2379", "c:2379"}
	all := map[string]string{"a:2379": "z1", "b:2379": "z1", "c:2379": "z2"}
	p, err := AttachOptions{Endpoints: eps, Zones: all, ClientZone: "z1"}.placement()
	zones, ok := p.zonesByEndpoint()
	if err != nil || !ok || !reflect.DeepEqual(zones, all) || p.clientZone != "z1" {
		t.Fatalf("zones given: %v (ok %v, client %q), %v", zones, ok, p.clientZone, err)
	}
	p, err = AttachOptions{Endpoints: eps}.placement()
	if _, ok := p.zonesByEndpoint(); err != nil || ok || p.Size() != 3 {
		t.Fatalf("no zones: %+v, %v", p, err)
	}
	for name, o := range map[string]AttachOptions{
		"zones without the client's": {Endpoints: eps, Zones: all},
		"the client's without zones": {Endpoints: eps, ClientZone: "z1"},
		"an endpoint without a zone": {Endpoints: eps, Zones: map[string]string{"a:2379": "z1", "b:2379": "z1"}, ClientZone: "z1"},
		"a zone for no endpoint":     {Endpoints: eps, Zones: map[string]string{"a:2379": "z1", "b:2379": "z1", "c:2379": "z2", "d:2379": "z2"}, ClientZone: "z1"},
	} {
		if _, err := o.placement(); !errors.Is(err, ErrBadZones) {
			t.Errorf("%s: %v, want ErrBadZones", name, err)
		}
	}
	// Refused before anything is dialed.
	bad := AttachOptions{Endpoints: eps, ClientZone: "z1"}
	for _, be := range []Backend{Etcd{}, ZooKeeper{}} {
		if c, err := be.Attach(t.Context(), bad); !errors.Is(err, ErrBadZones) {
			if c != nil {
				c.Close()
			}
			t.Errorf("%s: Attach with the client's zone alone: %v, want ErrBadZones", be.Name(), err)
		}
	}
}

func TestValidKeyPrefix(t *testing.T) {
	for _, ok := range []string{DefaultKeyPrefix, "routebench/20261203T100000Z-1a2b3c/", "a/b/c/", "my-app.bench/"} {
		if err := ValidKeyPrefix(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "/abs/", "noslash", "a//b/", "./", "a/../", "zookeeper/x/", "a\x00/", "a\n/", "\xff/"} {
		if err := ValidKeyPrefix(bad); !errors.Is(err, ErrBadKeyPrefix) {
			t.Errorf("%q: %v, want ErrBadKeyPrefix", bad, err)
		}
	}
}

// TestZnodesOfAPrefix: the test bed's keys keep their znodes one level
// under the root; a prefix of one's own puts the keys under its path.
func TestZnodesOfAPrefix(t *testing.T) {
	for _, z := range []znodes{{}, {DefaultKeyPrefix}} {
		if got := z.znode(keySpace(DefaultKeyPrefix).key(1)); got != "/bench_0000001" {
			t.Errorf("%+v: %s, want /bench_0000001", z, got)
		}
		if z.parents() != nil || z.flatPrefix() != "bench_" {
			t.Errorf("%+v: parents %v, flat prefix %q", z, z.parents(), z.flatPrefix())
		}
	}
	z := znodes{"routebench/run-1/"}
	if got := z.znode(keySpace("routebench/run-1/").key(42)); got != "/routebench/run-1/0000042" {
		t.Errorf("a key under the prefix: %s", got)
	}
	if got := z.znode("warmup/3"); got != "/warmup_3" {
		t.Errorf("a key outside the prefix: %s, want the test bed's naming", got)
	}
	if got := z.parents(); !slices.Equal(got, []string{"/routebench", "/routebench/run-1"}) {
		t.Errorf("parents %v", got)
	}
}

// TestRunnerAttachOptions: a key prefix of one's own, kept keys, TLS,
// credentials and zones need Endpoints; a bad prefix is refused.
func TestRunnerAttachOptions(t *testing.T) {
	eps := []string{"http://127.0.0.1:1"}
	for name, tc := range map[string]struct {
		opts Options
		want error
	}{
		"a prefix on the test bed": {Options{KeyPrefix: "mine/"}, ErrNotAttached},
		"keep on the test bed":     {Options{KeepKeys: true}, ErrNotAttached},
		"credentials on the bed":   {Options{Attach: AttachOptions{Username: "u", Password: "p"}}, ErrNotAttached},
		"a prefix without a /":     {Options{Endpoints: eps, KeyPrefix: "mine"}, ErrBadKeyPrefix},
	} {
		tc.opts.Backend, tc.opts.Workload = Etcd{}, DefaultWorkload()
		if r, err := NewRunner(tc.opts); !errors.Is(err, tc.want) {
			if err == nil {
				r.Close()
			}
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	r, err := NewRunner(Options{Backend: Etcd{}, Workload: DefaultWorkload()})
	if err != nil || r.opts.KeyPrefix != DefaultKeyPrefix {
		t.Fatalf("default prefix: %v", err)
	}
	r.Close()
}

// TestSeriesCountsEachSecond: each operation counts in the second it
// completed in, the last second taking what completed after the window.
func TestSeriesCountsEachSecond(t *testing.T) {
	start := time.Unix(1000, 0)
	s := newSeriesLog(start, 2500*time.Millisecond)
	if len(s.failures) != 3 {
		t.Fatalf("%d seconds for a 2.5 s window, want 3", len(s.failures))
	}
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	var lg workerLog
	read := func(ms int, d time.Duration) {
		lg.reads, lg.readSecs = append(lg.reads, d), append(lg.readSecs, s.second(at(ms)))
	}
	write := func(ms int, d time.Duration) {
		lg.writes, lg.writeSecs = append(lg.writes, d), append(lg.writeSecs, s.second(at(ms)))
	}
	read(100, 2*time.Millisecond)
	read(900, 6*time.Millisecond)
	read(950, 4*time.Millisecond)
	write(1500, 10*time.Millisecond)
	read(2600, time.Millisecond)         // after the window's end: its last second
	write(3200, 3*time.Millisecond)      // likewise
	s.failed(at(1200), true)             // second 1
	s.failed(at(-5), false)              // before the opening: the first second
	got := s.points([]workerLog{lg, {}}) // a worker that did nothing
	want := []SeriesPoint{
		{Reads: 3, ReadP50ms: 4, WriteErrors: 1},
		{Writes: 1, WriteP50ms: 10, ReadErrors: 1},
		{Reads: 1, Writes: 1, ReadP50ms: 1, WriteP50ms: 3},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("series %+v, want %+v", got, want)
	}
}

// TestResultsFileKeepsMetaAndSeries: results.json holds the run's meta and
// each record's series, and reads back as written; a file from before
// the meta, the records alone, still reads.
func TestResultsFileKeepsMetaAndSeries(t *testing.T) {
	res := Result{Scenario: ScenarioFailover, Variant: "80/20", Backend: "etcd", Policy: router.Hybrid, Trial: 1, Reads: 10, Writes: 2,
		ReadsByMember: []uint64{4, 3, 3}, Series: []SeriesPoint{{Reads: 6, Writes: 2, ReadP50ms: 1.5, WriteP50ms: 3.25}, {Reads: 4, ReadErrors: 1, WriteErrors: 2}}}
	c := &Comparison{Scenario: ScenarioFailover, Variant: "80/20", Baseline: router.Hybrid, Policies: []string{router.Hybrid},
		Metrics: []Metric{ReadP50}, Trials: map[string][]Result{router.Hybrid: {res}}}
	meta := NewMeta([]string{"routebench", "--endpoints", "a:2379", "--password", "…"}, "etcd", DefaultWorkload(),
		time.Date(2026, 12, 3, 10, 0, 0, 0, time.FixedZone("CET", 3600)))
	meta.Endpoints, meta.KeyPrefix, meta.CPUModes = []string{"a:2379"}, "routebench/x/", []string{CPUModeExternal}
	meta.ServerVersions = map[string][]string{"etcd": {"3.7.3", ""}}
	if meta.Started != "2026-12-03T09:00:00Z" || meta.Client.GoVersion == "" || meta.Client.NumCPU == 0 {
		t.Fatalf("meta %+v", meta)
	}
	dir := t.TempDir()
	if err := WriteFiles(dir, []*Comparison{c}, "header", meta); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "results.json")
	comps, got, err := LoadRun(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, meta) {
		t.Errorf("meta read back as %+v, want %+v", got, meta)
	}
	if len(comps) != 1 || len(comps[0].Trials[router.Hybrid]) != 1 || !reflect.DeepEqual(comps[0].Trials[router.Hybrid][0].Series, res.Series) {
		t.Fatalf("records read back as %+v", comps)
	}
	// The names the docs give.
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Meta    map[string]json.RawMessage   `json:"meta"`
		Results []map[string]json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(raw, &file); err != nil || len(file.Results) != 1 {
		t.Fatalf("results.json: %v", err)
	}
	for _, k := range []string{"command", "started", "backend", "workload", "endpoints", "key_prefix", "cpu_modes", "server_versions", "client"} {
		if _, ok := file.Meta[k]; !ok {
			t.Errorf("meta lacks %q", k)
		}
	}
	var points []map[string]any
	if err := json.Unmarshal(file.Results[0]["series"], &points); err != nil || len(points) != 2 {
		t.Fatalf("series: %v", err)
	}
	for _, k := range []string{"reads", "writes", "read_errors", "write_errors", "read_p50_ms", "write_p50_ms"} {
		if _, ok := points[0][k]; !ok {
			t.Errorf("a series point lacks %q", k)
		}
	}
	// Before the meta: an array of records.
	old, err := json.Marshal([]Result{res})
	if err != nil {
		t.Fatal(err)
	}
	oldPath := filepath.Join(dir, "old.json")
	if err := os.WriteFile(oldPath, old, 0o644); err != nil {
		t.Fatal(err)
	}
	if comps, got, err := LoadRun(oldPath); err != nil || got != nil || len(comps) != 1 {
		t.Fatalf("an old results.json: %d comparisons, meta %+v, %v", len(comps), got, err)
	}
	if comps, err := LoadComparisons(oldPath); err != nil || len(comps) != 1 {
		t.Fatalf("an old results.json through LoadComparisons: %d comparisons, %v", len(comps), err)
	}
}

// TestAttachedClusterLeavesNoKeys attaches to a test-bed etcd cluster that
// serves clients over TLS with auth on, as to a cluster of one's own:
// routed and stock clients get the TLS and credentials, a quick run under
// a prefix of its own leaves no key under it (nor under the default
// prefix), with KeepKeys it leaves them all, and a run on a prefix that
// holds keys is refused before it writes any.
func TestAttachedClusterLeavesNoKeys(t *testing.T) {
	tb := testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: testbed.FlatTopology(3), ClientTLS: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := clientv3.Config{Endpoints: tb.Endpoints(), TLS: tb.ClientTLS(), Logger: zap.NewNop(), DialTimeout: 10 * time.Second}
	admin, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			admin.Close()
			t.Fatal(err)
		}
	}
	admin.Close()
	cfg.Username, cfg.Password = "root", "rootpw"
	root, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	count := func(prefix string) int64 {
		t.Helper()
		resp, err := root.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatalf("counting the keys under %q: %v", prefix, err)
		}
		return resp.Count
	}

	w := DefaultWorkload()
	w.Duration, w.Warmup, w.Workers, w.Keys = time.Second, 200*time.Millisecond, 2, 50
	run := func(prefix string, keep bool) error {
		var versions []string
		r, err := NewRunner(Options{Backend: Etcd{}, Workload: w, Trials: 1, Policies: []string{router.Hybrid, Stock, Pinned},
			Endpoints: tb.Endpoints(), Attach: AttachOptions{TLS: tb.ClientTLS(), Username: "root", Password: "rootpw"},
			KeyPrefix: prefix, KeepKeys: keep, Logf: t.Logf, ServerVersions: func(_ string, v []string) { versions = v }})
		if err != nil {
			return err
		}
		comps, err := r.Run(ctx, ScenarioQuick)
		if cerr := r.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if len(versions) != 3 || slices.Contains(versions, "") {
			t.Errorf("servers' versions %q, want all three", versions)
		}
		for _, res := range Results(comps) {
			if res.Reads == 0 || res.Writes == 0 || len(res.Series) != 1 {
				t.Errorf("%s over TLS with credentials: %d reads, %d writes, %d errors, series %+v", res.Policy, res.Reads, res.Writes, res.Errors, res.Series)
			}
		}
		return nil
	}

	if err := run("routebench/cleaned/", false); err != nil {
		t.Fatal(err)
	}
	if n := count("routebench/cleaned/"); n != 0 {
		t.Errorf("%d keys left under the run's prefix, want none", n)
	}
	if n := count(DefaultKeyPrefix); n != 0 {
		t.Errorf("%d keys under %q, which the run was not to use", n, DefaultKeyPrefix)
	}

	// A fleet on the attached cluster writes and watches under the run's
	// prefix only, where the cleanup finds its keys.
	fleetCluster, err := Etcd{}.Attach(ctx, AttachOptions{Endpoints: tb.Endpoints(), TLS: tb.ClientTLS(), Username: "root", Password: "rootpw", KeyPrefix: "routebench/fleet/"})
	if err != nil {
		t.Fatal(err)
	}
	before := count("")
	res, err := RunFleet(ctx, fleetCluster, FleetOptions{Policy: router.Hybrid, Clients: 3, Window: time.Second, Rate: 5, Settle: 200 * time.Millisecond, Streams: true, KeyPrefix: "routebench/fleet/"})
	fleetCluster.Close()
	if err != nil || res.Failed != "" {
		t.Fatalf("a fleet on the attached cluster: %v %s", err, res.Failed)
	}
	if all, under := count("")-before, count("routebench/fleet/"); under == 0 || all != under {
		t.Errorf("the fleet wrote %d keys, %d of them under its prefix: want some, all there", all, under)
	}
	if _, err := root.Delete(ctx, "routebench/fleet/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}

	// Two runs given one prefix: the claim is one transaction, and the
	// second finds the first's key.
	attached, err := Etcd{}.Attach(ctx, AttachOptions{Endpoints: tb.Endpoints(), TLS: tb.ClientTLS(), Username: "root", Password: "rootpw", KeyPrefix: "routebench/claimed/"})
	if err != nil {
		t.Fatal(err)
	}
	ks := attached.(keyStore)
	if err := ks.claimKeys(ctx, "routebench/claimed/"); err != nil {
		t.Errorf("the first claim of an empty prefix: %v", err)
	}
	if err := ks.claimKeys(ctx, "routebench/claimed/"); !errors.Is(err, ErrPrefixInUse) {
		t.Errorf("a second claim of the prefix: %v, want ErrPrefixInUse", err)
	}
	if n, err := ks.deleteKeys(ctx, "routebench/claimed/"); err != nil || n != 1 {
		t.Errorf("deleting the claim: %d keys, %v; want the one", n, err)
	}
	attached.Close()

	if err := run("routebench/kept/", true); err != nil {
		t.Fatal(err)
	}
	if n := count("routebench/kept/"); n != int64(w.Keys) {
		t.Errorf("%d keys kept, want the %d of the key space", n, w.Keys)
	}
	// Deleting after it would take the kept keys: refused.
	if err := run("routebench/kept/", false); !errors.Is(err, ErrPrefixInUse) {
		t.Errorf("a run on a prefix holding keys: %v, want ErrPrefixInUse", err)
	}
	// A kept run would write over them: refused too.
	if err := run("routebench/kept/", true); !errors.Is(err, ErrPrefixInUse) {
		t.Errorf("a kept run on a prefix holding keys: %v, want ErrPrefixInUse", err)
	}
	if n := count("routebench/kept/"); n != int64(w.Keys) {
		t.Errorf("%d keys under the kept prefix after refused runs, want %d", n, w.Keys)
	}
}

// TestAttachedEnsembleKeepsWhatWasThere attaches to a test-bed ZooKeeper
// ensemble as to one of one's own: a run under a prefix whose outer znode
// an application already has (with data) deletes its keys and the parent
// it created, and leaves the application's znode as it was; a prefix that
// names an application's znode itself is refused before anything is
// written, and the znode keeps its data.
func TestAttachedEnsembleKeepsWhatWasThere(t *testing.T) {
	tb := testbed.SharedZKT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	app, _, err := zk.Connect(tb.Endpoints(), SessionTimeout, zk.WithLogger(testutil.Discard{}))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	for _, p := range []string{"/appdata", "/appdata/config"} {
		if _, err := app.Create(p, []byte("keep me"), 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatalf("creating %s: %v", p, err)
		}
	}
	w := DefaultWorkload()
	w.Duration, w.Warmup, w.Workers, w.Keys = time.Second, 200*time.Millisecond, 2, 20
	run := func(prefix string) error {
		r, err := NewRunner(Options{Backend: ZooKeeper{}, Workload: w, Trials: 1, Policies: []string{router.Hybrid},
			Endpoints: tb.Endpoints(), KeyPrefix: prefix, Logf: t.Logf})
		if err != nil {
			return err
		}
		_, err = r.Run(ctx, ScenarioZKHealthy)
		if cerr := r.Close(); err == nil {
			err = cerr
		}
		return err
	}
	if err := run("appdata/run/"); err != nil {
		t.Fatal(err)
	}
	// A plain go-zookeeper read is served from its server's state: synced
	// first, so that it sees what the run's sessions did elsewhere.
	if _, err := app.Sync("/appdata"); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := app.Exists("/appdata/run"); err != nil || ok {
		t.Errorf("the run's own parent /appdata/run: exists %v (%v), want it deleted", ok, err)
	}
	// A fleet needs the probes counted, which ZooKeeper's servers do not:
	// refused before any client connects.
	fleetCluster, err := ZooKeeper{}.Attach(ctx, AttachOptions{Endpoints: tb.Endpoints(), KeyPrefix: "appdata/fleet/"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = RunFleet(ctx, fleetCluster, FleetOptions{Policy: router.Hybrid, Clients: 3, Window: time.Second, Rate: 5, Settle: 5 * time.Second, KeyPrefix: "appdata/fleet/"})
	fleetCluster.Close()
	if !errors.Is(err, ErrNoProbeCounts) || time.Since(start) > 4*time.Second {
		t.Errorf("a fleet on an attached ensemble: %v after %v, want ErrNoProbeCounts before the clients settle", err, time.Since(start))
	}
	if err := app.Delete("/appdata/fleet", -1); err != nil { // the attach's claim; a runner's cleanup removes it
		t.Fatal(err)
	}
	if err := run("appdata/config/"); !errors.Is(err, ErrPrefixInUse) {
		t.Errorf("a run on a prefix naming the application's znode: %v, want ErrPrefixInUse", err)
	}
	for _, p := range []string{"/appdata", "/appdata/config"} {
		data, _, err := app.Get(p)
		if err != nil || string(data) != "keep me" {
			t.Errorf("the application's %s after the runs: %q, %v; want it as it was", p, data, err)
		}
	}
}

// TestAttachedSecureEnsemble: routebench attached to an ensemble that
// serves clients over TLS, with the application's znodes behind a digest
// ACL: its clients connect over TLS as the application's user, run under a
// prefix inside the protected znode and remove what they made; the
// application's znode is as it was, and still refuses a session without
// the digest (the run changed no ACL).
func TestAttachedSecureEnsemble(t *testing.T) {
	tb := testbed.StartZKT(t, testbed.ZKOptions{ClientTLS: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	app, _, err := ozk.Connect(tb.Endpoints(), SessionTimeout, ozk.WithTLS(tb.ClientTLS()), ozk.WithConnectTimeout(30*time.Second), ozk.WithLogger(testutil.Discard{}))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if err := app.AddAuthContext(ctx, "digest", []byte("app:apppw")); err != nil {
		t.Fatal(err)
	}
	if _, err := app.CreateContext(ctx, "/secure", []byte("keep me"), 0, zk.DigestACL(zk.PermAll, "app", "apppw")); err != nil {
		t.Fatal(err)
	}
	w := DefaultWorkload()
	w.Duration, w.Warmup, w.Workers, w.Keys = time.Second, 200*time.Millisecond, 2, 20
	// Half writes (set, or the scenario's 80/20 would win): on a loaded
	// machine two workers over TLS made 18 operations in the second, and
	// at a fifth of writes none was a write about one run in fifty.
	w.ReadRatio = 0.5
	r, err := NewRunner(Options{Backend: ZooKeeper{}, Workload: w, Set: map[string]bool{"read-ratio": true}, Trials: 1, Policies: []string{router.Hybrid},
		Endpoints: tb.Endpoints(), Attach: AttachOptions{TLS: tb.ClientTLS(), Username: "app", Password: "apppw"},
		KeyPrefix: "secure/run/", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	comps, err := r.Run(ctx, ScenarioZKHealthy)
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range Results(comps) {
		if res.Reads == 0 || res.Writes == 0 {
			t.Errorf("%s over TLS with the digest: %d reads, %d writes, %d errors", res.Policy, res.Reads, res.Writes, res.Errors)
		}
	}
	if ok, _, err := app.ExistsContext(ctx, "/secure/run"); err != nil || ok {
		t.Errorf("the run's parent /secure/run: exists %v (%v), want it deleted", ok, err)
	}
	if acl, _, err := app.GetACLContext(ctx, "/secure"); err != nil || !reflect.DeepEqual(acl, zk.DigestACL(zk.PermAll, "app", "apppw")) {
		t.Errorf("the application's /secure ACL after the run: %v, %v; want it as it was", acl, err)
	}
	if data, _, err := app.GetContext(ctx, "/secure"); err != nil || string(data) != "keep me" {
		t.Errorf("the application's /secure after the run: %q, %v; want it as it was", data, err)
	}
	anon, _, err := ozk.Connect(tb.Endpoints(), SessionTimeout, ozk.WithTLS(tb.ClientTLS()), ozk.WithConnectTimeout(30*time.Second), ozk.WithLogger(testutil.Discard{}))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, _, err := anon.GetContext(ctx, "/secure"); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("a session without the digest reading /secure: %v, want zk.ErrNoAuth", err)
	}
}
