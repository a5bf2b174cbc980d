package etcd_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testhooks"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/tools/testbed"
)

// Writes sent while the cluster elects a new leader (the old one
// SIGKILLed) wait for it instead of going to a follower, which would
// forward them to the dead leader and hold them until the caller's
// deadline: a write fails only if it was in flight at the kill (started
// before the process was gone, or within killNoticed after, on a
// connection whose reset had not reached the client yet), and no writer
// loses more than that one.
func TestWritesWaitOutAnElection(t *testing.T) {
	// killNoticed: the member's sockets close with its process, our proxy
	// then resets the client's connection, and the client's transport
	// reads the reset: wake-ups in three processes, which a starved
	// machine can stretch to a few scheduling slices each. The election
	// takes 1 s or more, so a write sent to a follower after the kill
	// still starts well past this.
	const killNoticed = 300 * time.Millisecond
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	cli := newClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Each write's deadline outlasts an election (one to two election
	// timeouts of 1 s) and the routing after it: with 2 s, a write sent just
	// after the kill ran out on a loaded machine (election 1.894 s, writing
	// again 266 ms later) though it waited as it should.
	const writers, pace, deadline = 8, 50 * time.Millisecond, 5 * time.Second
	var acked, failed atomic.Int64
	var okStarted [writers]atomic.Int64 // each writer's last acknowledged write's start, unix ns
	var mu sync.Mutex
	var errs []string
	type failure struct {
		writer int
		start  time.Time
	}
	var failures []failure
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			// Out of step with the others, as independent callers are:
			// writers in lockstep have all their writes in flight at once.
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(w) * pace / writers):
			}
			for i := range 2000 { // bounded: 100 s at the pace
				select {
				case <-stop:
					return
				case <-time.After(pace): // the load's pace, not synchronisation
				}
				wctx, wcancel := context.WithTimeout(ctx, deadline)
				start := time.Now()
				_, err := cli.Put(wctx, fmt.Sprintf("wait/%d/%d", w, i), "v")
				wcancel()
				if err != nil {
					failed.Add(1)
					mu.Lock()
					errs = append(errs, fmt.Sprintf("writer %d at %s after %v: %v", w, start.Format("15:04:05.000"), time.Since(start).Round(time.Millisecond), err))
					failures = append(failures, failure{w, start})
					mu.Unlock()
					continue
				}
				acked.Add(1)
				okStarted[w].Store(start.UnixNano())
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	testutil.Poll(t, 10*time.Second, "writes flowing", func() bool { return acked.Load() >= 5*writers })
	killed := time.Now()
	if err := c.Kill(old); err != nil {
		t.Fatal(err)
	}
	gone := time.Now() // Kill returns once the process has exited
	var now int
	testutil.Poll(t, 30*time.Second, "a new leader", func() bool { now, err = c.Leader(ctx); return err == nil && now != old })
	elected := time.Now()
	// Every writer acknowledged a write it started after the election: what
	// it held or sent before has ended, and failed counts it.
	testutil.Poll(t, 10*time.Second+deadline, "every writer writing again", func() bool {
		for w := range okStarted {
			if okStarted[w].Load() < elected.UnixNano() {
				return false
			}
		}
		return true
	})
	t.Logf("leader m%d killed, m%d elected %v later, every writer writing again %v after that", old, now, elected.Sub(killed).Round(time.Millisecond), time.Since(elected).Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	t.Logf("killed from %s to %s; %d writes failed: %v", killed.Format("15:04:05.000"), gone.Format("15:04:05.000"), failed.Load(), errs)
	lost := map[int]int{}
	for _, f := range failures {
		if f.start.After(gone.Add(killNoticed)) {
			t.Errorf("writer %d's write started at %s, %v after the leader's process was gone, failed: it should have waited for the new leader",
				f.writer, f.start.Format("15:04:05.000"), f.start.Sub(gone).Round(time.Millisecond))
		}
		if lost[f.writer]++; lost[f.writer] == 2 {
			t.Errorf("writer %d lost more than the write it had in flight at the kill: %v", f.writer, errs)
		}
	}
}

// A write waiting for a leader ends when the client closes, at once, with
// an error: nothing waits out its deadline behind a closed client.
func TestCloseReleasesWaitingWrites(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{})
	cli := newClient(t, c)
	ctx := context.Background()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "wait/first", "v"); err != nil { // a leader found: one lost is waited for
		t.Fatal(err)
	}
	for _, i := range []int{leader, (leader + 1) % 3} { // no quorum: no leader to wait for
		if err := c.Kill(i); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Poll(t, 10*time.Second, "the leader's connection down", func() bool { return !testhooks.EtcdLeaderReachable(cli) })
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := cli.Put(wctx, "wait/closed", "v"); done <- err }()
	testutil.Poll(t, 10*time.Second, "the write waiting for a leader", func() bool { return testhooks.EtcdWaitingWrites(cli) == 1 })
	start := time.Now()
	cli.Close()
	err = testutil.Receive(t, done, 5*time.Second, "the waiting write's end")
	if err == nil {
		t.Fatal("a write behind a closed client with no leader succeeded")
	}
	t.Logf("the waiting write ended %v after Close: %v", time.Since(start).Round(time.Millisecond), err)
}
