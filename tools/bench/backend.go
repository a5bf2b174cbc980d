package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// Comparator policies that are not router policies.
const (
	// Oracle sends writes over the test bed's knowledge of the true leader
	// (no tracking at all) and reads like hybrid: the floor routing can reach.
	Oracle = "oracle"
	// StaticLeader caches the leader once at start and never refreshes it:
	// the startup-only cache the paper's failover section warns against.
	StaticLeader = "static_leader"
	// Stock is an unmodified clientv3.New with the same configuration, the
	// paper's baseline: clientv3 round-robins every RPC over its endpoints
	// on one connection per member (etcd only).
	Stock = "stock"
	// Pinned is unmodified clientv3 clients each given one endpoint
	// (connections per member of them, endpoints dealt round robin), each
	// worker keeping one: what etcd's benchmark tool does, and what apps
	// that give each process one endpoint do (etcd only).
	Pinned = "pinned"
	// HybridHedge and HybridP2C are hybrid with every read hedged, and
	// with load-aware choice in the read pool: router policy names.
	HybridHedge = router.HybridHedge
	HybridP2C   = router.HybridP2C
	// EveryRound is hybrid probing every member every probe interval,
	// settled or not (StableProbeInterval = ProbeInterval): the router as
	// it probed before its cadence adapted, for the fleet comparison.
	EveryRound = "hybrid_every_round"
)

// Comparators returns the policies routebench compares besides the
// router's own.
func Comparators() []string {
	return []string{Stock, Pinned, Oracle, StaticLeader, HybridHedge, HybridP2C, EveryRound}
}

// stockPolicy reports whether policy runs a client without oproute.
func stockPolicy(policy string) bool { return policy == Stock || policy == Pinned }

// workerKey carries the index of the benchmark worker making a call, for
// clients that give each worker its own connection (Pinned).
type workerKey struct{}

func withWorker(ctx context.Context, w int) context.Context {
	return context.WithValue(ctx, workerKey{}, w)
}

// WorkerOf returns the index of the benchmark worker making a call (0
// outside one): what a Client that gives each worker its own connection
// (Pinned) keys on.
func WorkerOf(ctx context.Context) int {
	w, _ := ctx.Value(workerKey{}).(int)
	return w
}

// Backend starts or attaches to clusters of one store.
type Backend interface {
	// Name is the --backend value ("etcd", "zk").
	Name() string
	// Start starts a cluster on the test bed.
	Start(ctx context.Context, topo testbed.Topology) (Cluster, error)
	// Attach uses an existing cluster; it has no fault knobs.
	Attach(ctx context.Context, opts AttachOptions) (Cluster, error)
}

// AttachOptions say how to reach an existing cluster and where its
// members are: every client the attached cluster makes, routed, stock
// and its own status and admin clients, gets the same TLS and
// credentials.
type AttachOptions struct {
	// Endpoints are the members' client URLs (etcd) or host:port
	// (ZooKeeper).
	Endpoints []string
	// TLS, when set, connects over TLS with it (ZooKeeper: to the servers'
	// secureClientPort, four-letter words included).
	TLS *tls.Config
	// Username and Password authenticate every client: etcd's user,
	// ZooKeeper's digest scheme (user:password). Empty: no auth.
	Username, Password string
	// Zones places each endpoint (keyed as in Endpoints) in a zone and
	// ClientZone the clients: routed clients are told (WithZones), as
	// they are of the test bed's topology. Both or neither.
	Zones      map[string]string
	ClientZone string
	// KeyPrefix is the prefix of the workload's keys (Options.KeyPrefix):
	// a ZooKeeper ensemble keeps keys under a prefix other than
	// DefaultKeyPrefix as znodes under its path, whose parents Attach
	// creates. Empty: DefaultKeyPrefix.
	KeyPrefix string
}

// ErrBadZones: zones that do not place every endpoint, or a client zone
// without servers' zones (or the reverse).
var ErrBadZones = errors.New("bench: bad zones")

// withoutConnection reports whether o sets nothing of the connection or
// placement: no TLS, credentials or zones.
func (o AttachOptions) withoutConnection() bool {
	return o.TLS == nil && o.Username == "" && o.Password == "" && len(o.Zones) == 0 && o.ClientZone == ""
}

// placement is where o's members are: zones only when both the client's
// and every endpoint's are given.
func (o AttachOptions) placement() (placement, error) {
	p := placement{endpoints: o.Endpoints}
	if len(o.Zones) == 0 && o.ClientZone == "" {
		return p, nil
	}
	if len(o.Zones) == 0 || o.ClientZone == "" {
		return p, fmt.Errorf("%w: the client's zone and the endpoints' go together", ErrBadZones)
	}
	p.zones = make([]string, len(o.Endpoints))
	for i, ep := range o.Endpoints {
		z := o.Zones[ep]
		if z == "" {
			return p, fmt.Errorf("%w: no zone for endpoint %s", ErrBadZones, ep)
		}
		p.zones[i] = z
	}
	for ep := range o.Zones {
		if !slices.Contains(o.Endpoints, ep) {
			return p, fmt.Errorf("%w: a zone for %s, which is not an endpoint", ErrBadZones, ep)
		}
	}
	p.clientZone = o.ClientZone
	return p, nil
}

// Cluster is a cluster under test.
type Cluster interface {
	Size() int
	Endpoints() []string
	// Leader returns the index of the current leader as the servers say.
	Leader(ctx context.Context) (int, error)
	// Connect returns a client routed by policy (a router policy, Oracle or
	// StaticLeader) with connsPerMember connections per member.
	Connect(ctx context.Context, policy string, connsPerMember int) (Client, error)
	// Served returns per-member server-side counts, nil if unavailable.
	Served(ctx context.Context) ([]Served, error)
	// ServerCPU returns the CPU time each member's process has used so
	// far, nil if unknown.
	ServerCPU() []time.Duration
	// Traffic returns a snapshot of the bytes the test bed's proxies have
	// forwarded, for TrafficCounts.Since; ErrNeedsTestbed for an external
	// cluster.
	Traffic() (testbed.TrafficCounts, error)
	// Faults returns the fault knobs, nil for an external cluster.
	Faults() Faults
	Close() error
}

// Faults are the test bed's knobs.
type Faults = testbed.Faults

// Served is what one member served, by its own count: the test bed's
// (etcd's transactions apart from its writes).
type Served = testbed.Served

// Traffic is the bytes the test bed's proxies forwarded, total and
// cross-zone, client and peer.
type Traffic = testbed.Traffic

// CountingClient is a Client that counts more than its router tells (a
// server of its own between it and the cluster, say): the runner reads
// Counters at both ends of a trial's window and records each count's
// difference in Result.Extra under its name.
type CountingClient interface {
	Client
	Counters(ctx context.Context) map[string]float64
}

// Client is a routed client doing the benchmark's operations.
type Client interface {
	// Write stores value under key.
	Write(ctx context.Context, key string, value []byte) error
	// Read is a linearizable read of key, or of the keys in [key, end)
	// when end is not empty.
	Read(ctx context.Context, key, end string) error
	// Stats is the router's view.
	Stats() router.Stats
	Close() error
}

// placement is where a cluster's members are: what Cluster's Size and
// Endpoints report and what routed clients are told of zones.
type placement struct {
	endpoints  []string
	zones      []string // per endpoint; nil when attached without zones
	clientZone string   // "" when the clients have no zone
}

func placedOn(endpoints []string, topo testbed.Topology) placement {
	return placement{endpoints: endpoints, zones: topo.Zones, clientZone: topo.ClientZone}
}

func (p placement) Size() int           { return len(p.endpoints) }
func (p placement) Endpoints() []string { return p.endpoints }

// zonesByEndpoint is the routed clients' WithZones map; ok is false when
// the clients have no zone.
func (p placement) zonesByEndpoint() (zones map[string]string, ok bool) {
	if p.clientZone == "" {
		return nil, false
	}
	zones = make(map[string]string, len(p.endpoints))
	for i, ep := range p.endpoints {
		zones[ep] = p.zones[i]
	}
	return zones, true
}

// servedByMember asks every member for its counts at once: a member's
// /metrics take a while to fetch and parse on a loaded machine, and asked
// one after another they held the snapshot that opens a trial's window
// past a short window's end.
func servedByMember(n int, served func(i int) (Served, error)) ([]Served, error) {
	out := make([]Served, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i], errs[i] = served(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}
