package etcd

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/status"
)

// DefaultLeaderWait is how long a write waits for a leader it can reach
// while none is known (WithLeaderWait): etcd elects a new leader within
// one to two election timeouts (1 s each by default) of losing one.
const DefaultLeaderWait = 3 * time.Second

// WithLeaderWait sets how long a write waits for a leader while the client
// knows none it can reach: the leader's connection broke or the probes name
// none, as while the cluster elects a new one. Without the wait the write
// goes to another member, which forwards it to the leader it still
// believes in and holds it until the caller's deadline, as stock clientv3's
// writes do; a write that waits is not sent at all until a leader is
// reachable, and a caller whose deadline ends first gets DeadlineExceeded
// with nothing written. Default DefaultLeaderWait; 0 sends at once.
func WithLeaderWait(d time.Duration) Option { return func(o *options) { o.leaderWait = d } }

// leaderWatch lets writes wait for a reachable leader: the balancer and the
// probe rounds call wake when who can take a write may have changed.
type leaderWatch struct {
	mu      sync.Mutex
	ch      chan struct{} // closed by wake
	waiters atomic.Int32
	// seen: a write has found a reachable leader. Until then (a client
	// starting) writes do not wait: one sent to any member of a healthy
	// cluster is forwarded to its leader.
	seen atomic.Bool
	stop chan struct{} // closed when the client closes
	once sync.Once
}

func newLeaderWatch() leaderWatch { return leaderWatch{stop: make(chan struct{})} }

// close lets every waiting write go on (to fail as the closed client fails it).
func (w *leaderWatch) close() { w.once.Do(func() { close(w.stop) }) }

// changed returns a channel closed at the next wake.
func (w *leaderWatch) changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *leaderWatch) wake() {
	if w.waiters.Load() == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// leaderReachable reports whether the router knows a leader and some
// balancer of the client has a ready connection to it.
func (e *routerEntry) leaderReachable() bool {
	leader, ok := e.r.Leader()
	return ok && e.isConnected(leader)
}

// awaitLeader holds a write until the client knows a leader it can reach,
// for at most wait, or until ctx or the client ends (then the write goes
// on, and fails as gRPC fails it). Only a leader lost is waited for: before
// any write found one, writes go at once.
func (c *Client) awaitLeader(ctx context.Context, wait time.Duration) error {
	e := c.entry.Load()
	if e == nil || wait <= 0 {
		return nil
	}
	w := &e.leader
	if e.leaderReachable() {
		if !w.seen.Load() {
			w.seen.Store(true)
		}
		return nil
	}
	if !w.seen.Load() {
		return nil
	}
	w.waiters.Add(1)
	defer w.waiters.Add(-1)
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		ch := w.changed() // before the check: a change after it wakes us
		if e.leaderReachable() {
			return nil
		}
		select {
		case <-ch:
		case <-t.C:
			return nil // waited enough: the router's fallback member
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-w.stop:
			return nil
		}
	}
}
