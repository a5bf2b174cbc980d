// Package conformance is one suite of routing promises that every backend
// keeps, run against real clusters on the test bed:
//
//	func TestConformance(t *testing.T) { conformance.Run(t, myHarness{}) }
//
// Each property is a named subtest. Those that leave the cluster as they
// found it once healed (faults on links, a member paused and resumed, a
// follower killed) share one 3-member cluster, healed before each
// (testbed.Faults.Heal); those that move the leader, change the
// membership, need another topology or grow the store on purpose start
// their own. Where a count can be
// read on the server side (etcd's /metrics, ZooKeeper's four-letter words)
// the suite checks that, not only the router's own counters.
//
// Optional capabilities are optional interfaces on Client (TxnClient,
// SessionClient, StreamClient, MaintenanceClient), probed by the suite,
// rather than flags on the harness.
package conformance

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// Harness starts clusters of one backend and connects routed clients.
type Harness interface {
	// NewCluster starts a fresh cluster of size members on the default
	// emulated topology (member 0 leads, from the client's zone). The
	// harness closes it when t ends (t's Cleanup).
	NewCluster(t testing.TB, size int) Cluster
	// Connect returns a routed client of endpoints with the named policy:
	// one of router.Policies(), router.HybridHedge or router.HybridP2C
	// (passed on as the backend's policy). It must fail,
	// not hang, when no endpoint is reachable; connecting may wait up to
	// ConnectTimeout for that.
	Connect(endpoints []string, policy string) (Client, error)
}

// Hybrid's variants, which Harness.Connect gets as policy names.
const (
	HybridHedge = router.HybridHedge
	HybridP2C   = router.HybridP2C
)

// ConnectTimeout bounds Harness.Connect's wait for a reachable member.
const ConnectTimeout = 3 * time.Second

// Cluster is a running test-bed cluster: its fault knobs, and what its
// members served by their own count.
type Cluster interface {
	testbed.Faults
	// Endpoints lists the members' client addresses in member order.
	Endpoints() []string
	// Leader returns the leader's index as the servers see it.
	Leader(ctx context.Context) (int, error)
	// Served returns what member i has served so far, counted by the
	// member itself; zero for a member that is not running.
	Served(ctx context.Context, i int) (Served, error)
}

// Served counts the operations a member served, by its own account.
type Served = testbed.Served

// Client is a routed client.
type Client interface {
	// Put writes key=value.
	Put(ctx context.Context, key, value string) error
	// Get is a linearizable read.
	Get(ctx context.Context, key string) (value string, found bool, err error)
	// Stats returns the router's view, members in Endpoints order.
	Stats() router.Stats
	Close() error
}

// TxnClient is implemented by backends with multi-key transactions.
type TxnClient interface {
	// ReadOnlyTxn runs a transaction that only reads key.
	ReadOnlyTxn(ctx context.Context, key string) error
	// MixedTxn runs a transaction that reads key and writes key=value.
	MixedTxn(ctx context.Context, key, value string) error
}

// SessionClient is implemented by backends whose client holds a session
// that owns ephemeral keys and carries watches (ZooKeeper).
type SessionClient interface {
	// PutEphemeral creates key=value owned by the client's session.
	PutEphemeral(ctx context.Context, key, value string) error
	// SessionID identifies the session that owns the client's ephemerals.
	SessionID() int64
	// Owner returns the session that owns ephemeral key, 0 if none does.
	Owner(ctx context.Context, key string) (int64, error)
	// WatchVia sets a one-shot watch on key through member i; the channel
	// receives when key changes.
	WatchVia(ctx context.Context, member int, key string) (<-chan struct{}, error)
	// Expired is closed once the client has reported its session expired.
	Expired() <-chan struct{}
	// SessionTimeout is the session's negotiated timeout.
	SessionTimeout() time.Duration
}

// ClientCutter is implemented by clusters that can cut every client link
// while the members keep talking to each other.
type ClientCutter interface {
	// CutClients drops every byte between clients and members while on.
	CutClients(on bool)
	// DirectEndpoints are the members' own addresses, which the cut spares,
	// for checking the cluster's state from outside it.
	DirectEndpoints() []string
}

// PolicyEnv names the environment variable that chooses the policy the
// suite's properties run under, all but those about a named policy
// (hybrid's spread, round_robin, sticky, hedging, P2C): hybrid when unset,
// or least_cost. The full tier runs hybrid;
//
//	OPROUTE_CONFORMANCE_POLICY=least_cost go test -run TestConformance ./tools/backends/...
//
// runs the rest under least_cost.
const PolicyEnv = "OPROUTE_CONFORMANCE_POLICY"

// suitePolicy is the policy PolicyEnv names.
func suitePolicy() string {
	if p := os.Getenv(PolicyEnv); p != "" {
		return p
	}
	return router.Hybrid
}

// spreadsEvenly reports whether policy spreads linearizable reads evenly
// over its read pool (hybrid) rather than by what each member costs
// (least_cost): only then is a healthy member's share of reads a promise.
func spreadsEvenly(policy string) bool { return policy != router.LeastCost }

// Run runs every property against h.
func Run(t *testing.T, h Harness) {
	switch p := suitePolicy(); p {
	case router.Hybrid, router.LeastCost:
		t.Logf("properties not about a named policy run under %s (%s)", p, PolicyEnv)
	default:
		t.Fatalf("%s=%q: want %s or %s", PolicyEnv, p, router.Hybrid, router.LeastCost)
	}
	share(t, h)
	property(t, "HybridWritesToLeaderReadsSpread", func(t *testing.T) { testHybridRouting(t, h) })
	property(t, "TxnClassifiedByContent", func(t *testing.T) { testTxn(t, h) })
	property(t, "RoundRobinIsStock", func(t *testing.T) { testRoundRobin(t, h) })
	property(t, "LeaderMovedUnderLoad", func(t *testing.T) { testLeaderChange(t, h, false) })
	property(t, "LeaderKilledUnderLoad", func(t *testing.T) { testLeaderChange(t, h, true) })
	property(t, "DegradedMemberLeavesAndRejoins", func(t *testing.T) { testDegraded(t, h, suitePolicy()) })
	property(t, "AllEquallySlowNobodyEjected", func(t *testing.T) { testAllSlow(t, h) })
	property(t, "Distance/FarFollowerKeptAtLoad", func(t *testing.T) { testFarMemberKept(t, h, healed(t, h), farKeptWindow) })
	property(t, "Distance/ThreeZonesKeptAtLoad", func(t *testing.T) {
		testFarMemberKept(t, h, clusterOn(t, h, testbed.ThreeZoneTopology()), threeZonesKeptWindow)
	})
	property(t, "Distance/DegradedFarFollowerLeaves", func(t *testing.T) { testDegradedFar(t, h) })
	property(t, "Distance/DegradedBeforeClientStarts", func(t *testing.T) { testStartedDegraded(t, h) })
	property(t, "Distance/FarFollowerKeptWhenIdle", func(t *testing.T) { testKeptWhenIdle(t, h) })
	property(t, "LinearizableUnderLeaderChange", func(t *testing.T) { testLinearizable(t, h, fresh(t, h), suitePolicy(), leaderChangeFault) })
	property(t, "LinearizableUnderDegradedMember", func(t *testing.T) { testLinearizable(t, h, healed(t, h), suitePolicy(), degradedFault) })
	// Beyond the paper: hybrid's variants keep its promises.
	property(t, "Hedging/FirstAnswerNoDuplicateWrite", func(t *testing.T) { testLinearizable(t, h, healed(t, h), HybridHedge, stallFault) })
	property(t, "LoadAware/DegradedMemberLeavesAndRejoins", func(t *testing.T) { testDegraded(t, h, HybridP2C) })
	property(t, "StickyKeepsOneMember", func(t *testing.T) { testSticky(t, h) })
	property(t, "EphemeralSurvivesLeaderChange", func(t *testing.T) { testEphemeralSurvives(t, h) })
	property(t, "WatchFiresAfterMemberLoss", func(t *testing.T) { testWatchAfterLoss(t, h) })
	property(t, "SessionExpiryReported", func(t *testing.T) { testExpiry(t, h) })
	// The fault matrix: grey failures the router must route around.
	property(t, "Faults/BeyondCallerDeadline", func(t *testing.T) { testBeyondDeadline(t, h) })
	property(t, "Faults/FailingFast", func(t *testing.T) { testFailingFast(t, h) })
	property(t, "Faults/PartitionedFromPeers", func(t *testing.T) { testPartitioned(t, h) })
	property(t, "Faults/FrozenMemberHoldingStreams", func(t *testing.T) { testFrozenStreams(t, h) })
	property(t, "Faults/FrozenLeaderHoldingSession", func(t *testing.T) { testFrozenLeaderSession(t, h) })
	property(t, "Faults/MaintenanceIsNoSample", func(t *testing.T) { testMaintenance(t, h) })
	property(t, "Faults/LowRateNoFlapping", func(t *testing.T) { testLowRateNoFlapping(t, h) })
	property(t, "Membership/GrowAndShrink", func(t *testing.T) { testGrowAndShrink(t, h) })
	property(t, "BadInput", func(t *testing.T) { testBadInput(t, h) })
}

// RunRouting runs the properties about where operations go, against h: a
// server of another version (the compatibility matrix) keeps these
// promises as the one the suite is built for does: writes at the leader
// and reads spread, read-only Txns read, the leader followed when it moves
// and when it dies,
// a degraded member out of the read pool and back, a partitioned one
// routed around (its probes answered, its reads not).
func RunRouting(t *testing.T, h Harness) {
	share(t, h)
	property(t, "HybridWritesToLeaderReadsSpread", func(t *testing.T) { testHybridRouting(t, h) })
	property(t, "TxnClassifiedByContent", func(t *testing.T) { testTxn(t, h) })
	property(t, "LeaderMovedUnderLoad", func(t *testing.T) { testLeaderChange(t, h, false) })
	property(t, "LeaderKilledUnderLoad", func(t *testing.T) { testLeaderChange(t, h, true) })
	property(t, "DegradedMemberLeavesAndRejoins", func(t *testing.T) { testDegraded(t, h, router.Hybrid) })
	property(t, "Faults/PartitionedFromPeers", func(t *testing.T) { testPartitioned(t, h) })
}

// PropertyBudget bounds one property: one that runs longer fails with every
// goroutine's stack instead of holding the test binary until its timeout.
const PropertyBudget = 5 * time.Minute

// property runs f as the subtest name, within PropertyBudget.
func property(t *testing.T, name string, f func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		done := make(chan struct{})
		watchdog := time.AfterFunc(PropertyBudget, func() {
			select {
			case <-done:
				return
			default:
			}
			buf := make([]byte, 4<<20)
			buf = buf[:runtime.Stack(buf, true)]
			fmt.Fprintf(os.Stderr, "conformance: %s still running after %v; every goroutine:\n%s\n", t.Name(), PropertyBudget, buf)
			testbed.CloseAll() // the panic runs no Cleanup: nothing of the clusters may outlive it
			panic(fmt.Sprintf("conformance: %s exceeded its %v budget", t.Name(), PropertyBudget))
		})
		defer func() {
			close(done)
			watchdog.Stop()
		}()
		f(t)
	})
}
