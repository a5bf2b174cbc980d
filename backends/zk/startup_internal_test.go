package zk

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/internal/testutil"
)

// A Connect that fails leaves the probes other Conns share as it found
// them: its own reference is released once.
func TestFailedConnectKeepsSharedProbes(t *testing.T) {
	const addr = "127.0.0.1:1" // nothing listens there
	key := probeKey{addr: addr}
	acquireProbe(key) // a live Conn's
	defer releaseProbe(key)
	if _, _, err := Connect([]string{addr}, 6*time.Second, WithConnectTimeout(200*time.Millisecond), WithLogger(testutil.Discard{})); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("Connect: %v, want ErrUnreachable", err)
	}
	probes.mu.Lock()
	e := probes.entries[key]
	probes.mu.Unlock()
	if e == nil || e.refs != 1 {
		t.Fatalf("after a failed Connect the shared probe entry is %+v, want the live Conn's one reference", e)
	}
}

// A Conn started while its servers drop every connection attempt (a dial
// that waits out its timeout, as behind a DROP firewall) keeps waiting for
// its first session: with a session timeout of 1 s the dials are more than
// twice that apart, and the watchdog must not take a primary that was never
// established for an expired one.
func TestNeverEstablishedPrimaryIsNotExpired(t *testing.T) {
	var expired atomic.Bool
	drop := func(_, _ string, timeout time.Duration) (net.Conn, error) {
		time.Sleep(timeout)
		return nil, errors.New("dial: dropped")
	}
	conn, _, err := Connect([]string{"127.0.0.1:1"}, time.Second, WithDialer(drop), WithLogger(testutil.Discard{}),
		WithEventCallback(func(ev zk.Event) {
			if ev.State == zk.StateExpired {
				expired.Store(true)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(4 * time.Second) // past twice the session timeout and the dials' gap
	for time.Now().Before(deadline) {
		if expired.Load() {
			t.Fatal("the primary, never established, was declared expired")
		}
		time.Sleep(100 * time.Millisecond) // watching for an event that must not come
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := conn.GetContext(ctx, "/"); errors.Is(err, zk.ErrSessionExpired) {
		t.Fatalf("a call after 4 s: %v; the Conn must still wait for its first session", err)
	}
}
