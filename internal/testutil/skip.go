package testutil

import (
	"flag"
	"os"
	"testing"
)

// The full tier (go test without -short: what the README's test command and
// CI run) skips nothing silently. Under CI=true a Skip fails its test unless
// the test is listed in allowedSkips, with the reason it may skip; the quick
// tier (go test -short) skips every test that starts real servers.

// allowedSkips names the tests (t.Name()) that may skip in the full tier,
// each with why: a property of the conformance suite that one backend has
// no means to show.
var allowedSkips = map[string]string{
	"TestConformance/TxnClassifiedByContent":        "ZooKeeper has no transactions of the kind (a Multi is always a write)",
	"TestConformance/Faults/MaintenanceIsNoSample":  "ZooKeeper has no member-local maintenance calls (defragment, snapshot)",
	"TestConformance/EphemeralSurvivesLeaderChange": "etcd's client holds no session of its own (leases are the caller's)",
	"TestConformance/WatchFiresAfterMemberLoss":     "etcd's client holds no session of its own (WatchFrom covers its watches)",
	"TestConformance/SessionExpiryReported":         "etcd's client holds no session of its own",
	// The Kubernetes module's routing check assigns each write to the member
	// that led when it was served; an election nobody asked for (a member
	// starved of CPU past its election timeout) leaves that unknown.
	"TestStorage/Routing": "an election nobody asked for leaves the writes unassignable to a leader",
	// Its first build compiles Kubernetes (2,080 packages): minutes the
	// full tier's time floor has no room for.
	"TestAPIServer":              "builds kube-apiserver from released sources; OPROUTE_KUBE_APISERVER=1 runs it",
	"TestAPIServerLeaderChanges": "builds kube-apiserver from released sources; OPROUTE_KUBE_APISERVER=1 runs it",
}

// inCI reports whether the tests run as CI runs them: CI=true, full tier.
func inCI() bool { return os.Getenv("CI") == "true" && !testing.Short() }

// Skip skips t, saying why; under CI in the full tier it fails t instead
// unless t is in allowedSkips.
func Skip(t testing.TB, reason string) {
	t.Helper()
	if _, ok := allowedSkips[t.Name()]; inCI() && !ok {
		t.Fatalf("skipped in the full tier (%s), and not in testutil's allowedSkips", reason)
	}
	t.Skip(reason)
}

// Skipper is what NeedsServers needs of a test.
type Skipper interface {
	Helper()
	Skip(args ...any)
}

// NeedsServers skips t in the quick tier (go test -short): it starts real
// etcd members or ZooKeeper servers, which only the full tier does.
func NeedsServers(t Skipper) {
	if testing.Short() {
		t.Helper()
		t.Skip("starts real servers: full tier only (go test without -short)")
	}
}

// MainSkippingExamplesInQuickTier is for a TestMain whose package's
// examples start real servers: an example cannot skip itself, so in the
// quick tier (-short) it adds -test.skip=^Example, unless the caller set
// -test.skip. It parses the flags (TestMain must, to read -short).
func MainSkippingExamplesInQuickTier() {
	flag.Parse()
	if testing.Short() {
		if f := flag.Lookup("test.skip"); f != nil && f.Value.String() == "" {
			f.Value.Set("^Example")
		}
	}
}

// SkipUnderRace skips t in a race-instrumented binary. It is for a long
// computation in one goroutine (a simulation in virtual time, a statistic
// over many rounds): the race detector has nothing to find there and slows
// it about tenfold. The full tier runs the package again without the race
// detector (test.sh's last pass), where t runs at full size.
func SkipUnderRace(t testing.TB, what string) {
	t.Helper()
	if RaceEnabled {
		t.Skip(what + ": one goroutine's computation, run by the full tier's pass without the race detector")
	}
}

// MostlyWaits is called first by a test whose time is spent waiting on a
// cluster of its own that it keeps idle or nearly so: a stable probe
// interval, a frozen member's timeouts, an election. It runs the test
// with t.Parallel: beside the package's other such tests (go test's
// -parallel, the cores' count), after the package's others. A test that
// loads the cores, times delays of a few milliseconds, checks the
// process's goroutines (goleak), or shares a cluster must not call it.
func MostlyWaits(t *testing.T) {
	t.Helper()
	t.Parallel()
}
