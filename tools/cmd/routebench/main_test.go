package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oproute/oproute/tools/bench"
)

func TestSetupsFor(t *testing.T) {
	flags := setup{"", auto, auto, false}
	all := []setup{{"", auto, auto, false}, {"", "0", auto, false}, {threeZones, auto, auto, false}, {threeZones, "0", auto, false}}
	for _, tc := range []struct {
		name     string
		names    []string
		set      []string
		external bool
		want     []setup
	}{
		{"the grid", []string{bench.ScenarioDominance}, nil, false, all},
		{"with zk-dominance", []string{bench.ScenarioHealthy, bench.ScenarioZKDominance}, []string{"trials"}, false, all},
		{"not a grid scenario", []string{bench.ScenarioHealthy}, nil, false, []setup{flags}},
		{"all", []string{bench.ScenarioAll}, nil, false, []setup{flags}},
		{"--topology picks one", []string{bench.ScenarioDominance}, []string{"topology"}, false, []setup{flags}},
		{"--member-cpu picks one", []string{bench.ScenarioDominance}, []string{"member-cpu"}, false, []setup{flags}},
		{"--endpoints", []string{bench.ScenarioDominance}, nil, true, []setup{flags}},
	} {
		set := map[string]bool{}
		for _, f := range tc.set {
			set[f] = true
		}
		got, grid := setupsFor(tc.names, set, flags, tc.external)
		if !slices.Equal(got, tc.want) || grid != (len(tc.want) > 1) {
			t.Errorf("%s: %v (grid %v), want %v", tc.name, got, grid, tc.want)
		}
	}
	// --client-cpu holds for the budgets, not for shared cores.
	// --sim spans the layouts only: it has one CPU model.
	sim := setup{"", auto, auto, true}
	if got, grid := setupsFor([]string{bench.ScenarioDominance}, map[string]bool{}, sim, false); !grid || !slices.Equal(got, []setup{sim, {threeZones, auto, auto, true}}) {
		t.Errorf("--sim: %v (grid %v), want the two layouts", got, grid)
	}
	got, _ := setupsFor([]string{bench.ScenarioDominance}, map[string]bool{"client-cpu": true}, setup{"", auto, "0.7", false}, false)
	for _, s := range got {
		if want := map[string]string{auto: "0.7", "0": auto}[s.memberCPU]; s.clientCPU != want {
			t.Errorf("%+v: client %s, want %s", s, s.clientCPU, want)
		}
	}
}

// TestSetupOptions: the grid's setups name their layout, and the shared
// cores leave the client unconfined.
func TestSetupOptions(t *testing.T) {
	base := bench.Options{Workload: bench.DefaultWorkload(), Nodes: 3}
	opts, err := setup{threeZones, "0", auto, false}.options(base, "zk")
	if err != nil {
		t.Fatal(err)
	}
	if opts.TopologyName != threeZones || opts.Topology == nil || opts.ClientCPU != 0 || bench.BudgetsOf(opts.Backend).Confined() || opts.Backend.Name() != "zk" {
		t.Errorf("three zones on shared cores: %+v", opts)
	}
	if opts, err = (setup{"", "0", auto, false}).options(base, "etcd"); err != nil || opts.TopologyName != "default" || opts.Topology != nil {
		t.Errorf("default topology: %+v, %v", opts, err)
	}
	if _, err := (setup{"", "0", auto, false}).options(base, "mongo"); err == nil {
		t.Error("an unknown backend was accepted")
	}
	// --sim: a simulated backend of the store's kind, on the layout.
	if opts, err = (setup{threeZones, auto, auto, true}).options(base, "etcd"); err != nil || opts.Backend.Name() != "sim" || opts.TopologyName != threeZones {
		t.Errorf("--sim: %+v, %v", opts, err)
	}
}

// TestExternalFlags: the flags for a cluster of one's own need
// --endpoints, go in their pairs, and are read into the attach options
// and the key prefix.
func TestExternalFlags(t *testing.T) {
	for _, f := range externalOnly {
		if _, _, err := (external{}).options(map[string]bool{f: true}, "id"); !errors.Is(err, errExternalOnly) || !strings.Contains(err.Error(), "--"+f) {
			t.Errorf("--%s without --endpoints: %v", f, err)
		}
	}
	if o, prefix, err := (external{}).options(map[string]bool{"trials": true}, "id"); err != nil || prefix != "" || o.TLS != nil {
		t.Errorf("the test bed: %+v, %q, %v", o, prefix, err)
	}
	eps := []string{"https://10.0.0.1:2379", "https://10.0.0.2:2379", "https://10.0.0.3:2379"}
	with := func(f func(*external)) external {
		e := external{endpoints: eps}
		f(&e)
		return e
	}
	for name, e := range map[string]external{
		"--cert without --key":         with(func(e *external) { e.cert = "c.pem" }),
		"--key without --cert":         with(func(e *external) { e.key = "k.pem" }),
		"--password without --user":    with(func(e *external) { e.password = "pw" }),
		"--user without a password":    with(func(e *external) { e.user = "bench" }),
		"--zones without the client's": with(func(e *external) { e.zones = "https://10.0.0.1:2379=a" }),
		"--client-zone alone":          with(func(e *external) { e.clientZone = "a" }),
		"a zone for no endpoint":       with(func(e *external) { e.zones, e.clientZone = "https://10.0.0.9:2379=a", "a" }),
		"an endpoint without a zone":   with(func(e *external) { e.zones, e.clientZone = "https://10.0.0.1:2379=a,https://10.0.0.2:2379=a", "a" }),
		"an endpoint twice": with(func(e *external) {
			e.zones, e.clientZone = "https://10.0.0.1:2379=a,https://10.0.0.1:2379=b,https://10.0.0.2:2379=a,https://10.0.0.3:2379=b", "a"
		}),
		"a zone without its endpoint": with(func(e *external) { e.zones, e.clientZone = "=a", "a" }),
		"a prefix without its /":      with(func(e *external) { e.prefix = "mine" }),
		"a prefix under /zookeeper":   with(func(e *external) { e.prefix = "zookeeper/x/" }),
		"a CA file that is not there": with(func(e *external) { e.cacert = filepath.Join(t.TempDir(), "none.pem") }),
	} {
		if _, _, err := e.options(map[string]bool{}, "id"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// The default prefix is the run's own.
	o, prefix, err := (external{endpoints: eps}).options(map[string]bool{}, "20261203T100000Z-abcdef")
	if err != nil || prefix != "routebench/20261203T100000Z-abcdef/" || o.TLS != nil || o.Username != "" || o.Zones != nil {
		t.Fatalf("defaults: %+v, %q, %v", o, prefix, err)
	}
	if err := bench.ValidKeyPrefix(prefix); err != nil {
		t.Fatal(err)
	}
	if id := runID(time.Unix(0, 0)); !strings.HasPrefix(id, "19700101T000000Z-") || len(id) != len("19700101T000000Z-abcdef") || bench.ValidKeyPrefix("routebench/"+id+"/") != nil {
		t.Errorf("run id %q", id)
	}
	// Everything given.
	files := writeTestPKI(t)
	o, prefix, err = with(func(e *external) {
		e.cacert, e.cert, e.key = files.ca, files.cert, files.key
		e.user, e.password = "bench", "pw"
		e.zones, e.clientZone = "https://10.0.0.1:2379=a, https://10.0.0.2:2379=a,https://10.0.0.3:2379=b", "a"
		e.prefix = "mine/run-1/"
	}).options(map[string]bool{}, "id")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{eps[0]: "a", eps[1]: "a", eps[2]: "b"}
	if prefix != "mine/run-1/" || o.TLS == nil || o.TLS.RootCAs == nil || len(o.TLS.Certificates) != 1 ||
		o.Username != "bench" || o.Password != "pw" || o.ClientZone != "a" || !reflect.DeepEqual(o.Zones, want) {
		t.Errorf("everything given: %+v, %q", o, prefix)
	}
}

// TestLoadTLS: a CA file and a client certificate with its key make a
// configuration that trusts the CA and presents the certificate; files
// that are not what they say are refused.
func TestLoadTLS(t *testing.T) {
	if cfg, err := loadTLS("", "", ""); cfg != nil || err != nil {
		t.Fatalf("no files: %v, %v", cfg, err)
	}
	files := writeTestPKI(t)
	cfg, err := loadTLS(files.ca, files.cert, files.key)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Certificates) != 1 || cfg.RootCAs == nil {
		t.Fatalf("%+v", cfg)
	}
	leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: cfg.RootCAs, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the client certificate does not verify against the CA loaded: %v", err)
	}
	if cfg, err := loadTLS(files.ca, "", ""); err != nil || cfg.RootCAs == nil || len(cfg.Certificates) != 0 {
		t.Errorf("a CA alone: %+v, %v", cfg, err)
	}
	if cfg, err := loadTLS("", files.cert, files.key); err != nil || cfg.RootCAs != nil || len(cfg.Certificates) != 1 {
		t.Errorf("a client certificate alone (the host's CAs): %+v, %v", cfg, err)
	}
	for name, args := range map[string][3]string{
		"a CA file without a certificate": {files.key, "", ""},
		"a missing CA file":               {files.ca + ".gone", "", ""},
		"a key that is not the cert's":    {files.ca, files.cert, files.otherKey},
		"a certificate given as its key":  {files.ca, files.cert, files.cert},
	} {
		if _, err := loadTLS(args[0], args[1], args[2]); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestRedactedCommandLine: results.json keeps the command line but the
// password.
func TestRedactedCommandLine(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"routebench", "--endpoints", "a", "--user", "u", "--password", "s3cret", "--keep"}, []string{"routebench", "--endpoints", "a", "--user", "u", "--password", "REDACTED", "--keep"}},
		{[]string{"routebench", "-password=s3cret"}, []string{"routebench", "-password=REDACTED"}},
		{[]string{"routebench", "--password=s3cret", "--prefix", "p/"}, []string{"routebench", "--password=REDACTED", "--prefix", "p/"}},
		{[]string{"routebench", "--trials", "2"}, []string{"routebench", "--trials", "2"}},
	} {
		in := slices.Clone(tc.in)
		if got := redacted(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("redacted(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if !slices.Equal(tc.in, in) {
			t.Errorf("redacted changed its argument to %q", tc.in)
		}
	}
}

// testPKI are PEM files of a throw-away CA and a client certificate it
// signed, and a key of no certificate's.
type testPKI struct{ ca, cert, key, otherKey string }

func writeTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	writeKey := func(name string, k *ecdsa.PrivateKey) string {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name, "PRIVATE KEY", der)
	}
	now := time.Now()
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "routebench test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key := newKey()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "routebench"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return testPKI{ca: write("ca.pem", "CERTIFICATE", caDER), cert: write("client.pem", "CERTIFICATE", der),
		key: writeKey("client-key.pem", key), otherKey: writeKey("other-key.pem", newKey())}
}
