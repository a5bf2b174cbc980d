package conformance

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// The properties that leave a cluster as they found it, once its faults are
// healed, share one: a ZooKeeper ensemble takes seconds of JVM start-up, a
// third of the suite's time when each property had its own. Their counts
// are server-side deltas, their keys their own, their clients closed when
// they end; what they leave is data in the store, which none of them
// measures.

// sharedClusters holds, per harness type, the cluster that Run's
// properties share, and the test that Run runs under, whose end closes it.
var sharedClusters sync.Map // harness type → *sharedCluster

type sharedCluster struct {
	owner *testing.T // Run's test: the cluster is closed when it ends

	mu      sync.Mutex
	cluster Cluster // nil until a property needs it
}

// share makes h's shareable properties share one cluster for the rest of
// t, started when the first of them needs it.
func share(t *testing.T, h Harness) {
	key := sharedKey(h)
	sharedClusters.Store(key, &sharedCluster{owner: t})
	t.Cleanup(func() { sharedClusters.Delete(key) })
}

// sharedKey names h's shared cluster: its type and its settings (an etcd
// harness's server of another version).
func sharedKey(h Harness) string { return fmt.Sprintf("%T %+v", h, h) }

// healBound is how long a heal may take: on ZooKeeper, moving leadership
// back restarts servers until the right one wins (see electionBound).
const healBound = 2 * electionBound

// healed returns the 3-member cluster on the default topology that h's
// properties share, healed of every earlier fault, with member 0 leading.
// Outside Run (no cluster to share) it starts one for t. A cluster that
// does not heal is closed and a new one started.
func healed(t *testing.T, h Harness) Cluster {
	t.Helper()
	v, ok := sharedClusters.Load(sharedKey(h))
	if !ok {
		return fresh(t, h)
	}
	s := v.(*sharedCluster)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), healBound)
		start := time.Now()
		err := s.cluster.Heal(ctx)
		cancel()
		if err == nil {
			if took := time.Since(start); took > time.Second {
				t.Logf("healing the shared cluster took %v", took.Round(time.Millisecond))
			}
			return s.cluster
		}
		t.Logf("the shared cluster did not heal (%v): starting another", err)
		if c, ok := s.cluster.(interface{ Close() error }); ok {
			c.Close()
		}
		s.cluster = nil
	}
	s.cluster = h.NewCluster(lent{TB: t, owner: s.owner}, 3)
	return s.cluster
}

// fresh starts a 3-member cluster on the default topology for t alone:
// for properties that move the leader, which a heal would have to undo by
// elections (on ZooKeeper, JVM restarts), or whose measure depends on
// the store's size.
func fresh(t *testing.T, h Harness) Cluster {
	t.Helper()
	return h.NewCluster(t, 3)
}

// lent is the test a shared cluster is started under: the property that
// needs it first fails or skips if it cannot start, but the cluster is
// closed, and its servers' errors shown, when its owner ends.
type lent struct {
	testing.TB
	owner *testing.T
}

func (l lent) Cleanup(f func())                { l.owner.Cleanup(f) }
func (l lent) Failed() bool                    { return l.owner.Failed() }
func (l lent) Logf(format string, args ...any) { l.owner.Logf(format, args...) }
