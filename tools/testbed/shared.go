package testbed

import (
	"context"
	"sync"
	"time"
)

// The ZooKeeper ensemble a test binary's tests share: each ensemble takes
// seconds of JVM start-up, and a package's tests that leave one as they
// found it, once its faults are healed, need no ensemble of their own.
// Such a test counts by deltas, writes znodes of its own and closes its
// clients; what it leaves is data, which no sharer measures.
var shared struct {
	mu sync.Mutex
	zk *ZKCluster
	// served names the tests the ensemble was handed to: one asking again
	// (go test -count) would find its own znodes from the last time.
	served map[string]bool
}

// SharedZKT returns the 3-member ZooKeeper ensemble on the default
// topology that the test binary's tests share, healed of every earlier
// fault (Heal: the faults undone, paused servers resumed, killed ones
// restarted, the topology's leader leading), started for the first test
// that asks. An ensemble that does not heal is closed and another
// started. It is closed when the binary's tests end (Main). As with
// StartZKT, a test skips without servers (the quick tier).
func SharedZKT(tb interface {
	Helper()
	Fatal(...any)
	Skip(...any)
	Logf(string, ...any)
	Name() string
}) *ZKCluster {
	tb.Helper()
	prepareT(tb)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.served[tb.Name()] {
		// The same test again (go test -count): a fresh ensemble, as it
		// had the first time.
		closeSharedLocked()
	}
	defer func() {
		if shared.served != nil { // nil when the start failed
			shared.served[tb.Name()] = true
		}
	}()
	if shared.zk != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := shared.zk.Heal(ctx)
		cancel()
		if err == nil {
			return shared.zk
		}
		tb.Logf("the shared ensemble did not heal (%v): starting another", err)
		shared.zk.Close()
		shared.zk = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartZK(ctx, ZKOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	shared.zk, shared.served = c, map[string]bool{}
	return c
}

// closeShared closes the shared ensemble, if one was started.
func closeShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	closeSharedLocked()
}

func closeSharedLocked() {
	if shared.zk != nil {
		shared.zk.Close()
		shared.zk = nil
	}
	shared.served = nil
}
