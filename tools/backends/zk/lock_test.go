package zk_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/tools/testbed"
)

// TestLockUnderFaults: three Conns contend for one Lock (one of them with
// stale reads, which the recipe must not use) while the leader changes
// and then a follower freezes. Inside the lock each holder increments a
// counter with a version-checked write: no two holders at once (the
// holders are in this process, so it is counted directly), no lost
// increment. A version conflict on a linearizable Conn is a second holder's
// write too; on the stale-read Conn its own read of the counter may be
// behind (the option's promise), so there it is only counted.
func TestLockUnderFaults(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, _ := connect(t, c)
	if _, err := admin.CreateContext(ctx, "/counter", []byte("0"), 0, acl); err != nil {
		t.Fatal(err)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const contenders, rounds = 3, 60
	var (
		inside, overlaps, held, uncertain, staleConflicts atomic.Int64
		mu                                                sync.Mutex
		failures                                          = map[string]int{}
	)
	fail := func(what string, err error) {
		mu.Lock()
		failures[what+": "+err.Error()]++
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for k := range contenders {
		var opts []ozk.Option
		if k == 1 {
			opts = append(opts, ozk.WithStaleReads())
		}
		conn, _ := connect(t, c, opts...)
		lock := ozk.NewLock(conn, "/locks/counter", acl)
		wg.Go(func() {
			for range rounds {
				lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := lock.LockContext(lctx)
				cancel()
				if err != nil {
					fail("lock", err)
					continue
				}
				if inside.Add(1) > 1 {
					overlaps.Add(1)
				}
				b, st, err := conn.GetContext(ctx, "/counter")
				if err == nil {
					n, _ := strconv.Atoi(string(b))
					_, err = conn.SetContext(ctx, "/counter", []byte(strconv.Itoa(n+1)), st.Version)
					switch {
					case err == nil:
						held.Add(1)
					case errors.Is(err, zk.ErrBadVersion) && k == 1:
						staleConflicts.Add(1) // its stale read was behind the counter
					case errors.Is(err, zk.ErrBadVersion):
						overlaps.Add(1) // another holder wrote meanwhile
					default:
						uncertain.Add(1) // cut in flight: applied or not
					}
				}
				if err != nil {
					fail("inside", err)
				}
				inside.Add(-1)
				if err := lock.Unlock(); err != nil {
					fail("unlock", err)
				}
			}
		})
	}
	testutil.Poll(t, time.Minute, "lock rounds under way", func() bool { return held.Load() >= 20 })
	if err := c.MoveLeader(ctx, (leader+1)%c.Size()); err != nil {
		t.Fatal(err)
	}
	at := held.Load()
	testutil.Poll(t, time.Minute, "lock rounds after the leader change", func() bool { return held.Load() >= at+20 })
	frozen := (leader + 2) % c.Size() // a follower now
	if err := c.Pause(frozen); err != nil {
		t.Fatal(err)
	}
	at = held.Load()
	testutil.Poll(t, time.Minute, "lock rounds with a frozen follower", func() bool { return held.Load() >= at+20 })
	if err := c.Resume(frozen); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	b, _, err := admin.GetContext(ctx, "/counter")
	if err != nil {
		t.Fatal(err)
	}
	counter, _ := strconv.Atoi(string(b))
	t.Logf("%d increments under the lock, %d uncertain, counter %d; %d version conflicts after the stale-read Conn's own reads; failures %v", held.Load(), uncertain.Load(), counter, staleConflicts.Load(), failures)
	if overlaps.Load() > 0 {
		t.Errorf("%d times two Conns held the lock at once", overlaps.Load())
	}
	if n := int64(counter); n < held.Load() || n > held.Load()+uncertain.Load() {
		t.Errorf("counter %d, want %d (+ up to %d uncertain)", counter, held.Load(), uncertain.Load())
	}
	children, _, err := admin.ChildrenContext(ctx, "/locks/counter")
	if err != nil || len(children) != 0 {
		t.Errorf("lock nodes left: %v, %v", children, err)
	}
}

// A LockContext that gives up leaves no node behind: a node left there
// would take the lock later for nobody, and every contender would wait for
// the Conn's session to end.
func TestLockContextGivesUpCleanly(t *testing.T) {
	c := testbed.SharedZKT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, _ := connect(t, c)
	b, _ := connect(t, c)
	la, lb := ozk.NewLock(a, "/locks/x", acl), ozk.NewLock(b, "/locks/x", acl)
	if err := la.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if err := lb.LockContext(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockContext while held: %v, want context.DeadlineExceeded", err)
	}
	gone, cancelGone := context.WithCancel(ctx)
	cancelGone() // given up before the create is even answered
	if err := lb.LockContext(gone); !errors.Is(err, context.Canceled) {
		t.Fatalf("LockContext with a cancelled context: %v, want context.Canceled", err)
	}
	if children, _, err := a.ChildrenContext(ctx, "/locks/x"); err != nil || len(children) != 1 {
		t.Fatalf("lock nodes after two abandoned attempts: %v, %v; want only the holder's", children, err)
	}
	if err := la.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := lb.LockContext(ctx); err != nil {
		t.Fatalf("the lock after its holder left: %v", err)
	}
	if err := lb.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := lb.Unlock(); !errors.Is(err, zk.ErrNotLocked) {
		t.Errorf("second Unlock: %v, want zk.ErrNotLocked", err)
	}

	// A waiter whose node is deleted under it (its session expired, an
	// operator) must not take the lock without a node when the holder
	// leaves.
	if err := la.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { res <- lb.LockContext(ctx) }()
	var waiter string
	testutil.Poll(t, 10*time.Second, "the waiter's node", func() bool {
		children, _, _ := a.ChildrenContext(ctx, "/locks/x")
		for _, ch := range children {
			if "/locks/x/"+ch != la.Path() {
				waiter = "/locks/x/" + ch
			}
		}
		return waiter != ""
	})
	if err := a.DeleteContext(ctx, waiter, -1); err != nil {
		t.Fatal(err)
	}
	if err := la.Unlock(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if !errors.Is(err, zk.ErrNoNode) {
			t.Errorf("waiter whose node was deleted: %v, want an error wrapping zk.ErrNoNode", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter whose node was deleted still waits")
	}
}

// TestLockAbandonedCreateLeavesNoNode: a LockContext whose create cannot
// commit (both followers frozen: the leader holds the proposal without a
// quorum, and stays leader for syncLimit ticks, so no session expires)
// gives up after the session timeout; once the followers resume, the
// proposal commits, and the node it makes would take the lock for nobody
// while the session lives. It is removed (in the background, or by the
// Lock's next attempt), and another Conn takes the lock.
func TestLockAbandonedCreateLeavesNoNode(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	holder, _ := connect(t, c)
	other, _ := connect(t, c)
	for _, p := range []string{"/orphan", "/orphan/lock"} {
		if _, err := holder.CreateContext(ctx, p, nil, 0, acl); err != nil {
			t.Fatal(err)
		}
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The followers, not the leader: a leader frozen and resumed expires
	// the sessions it stopped hearing from by its wall clock.
	frozen := []int{(leader + 1) % c.Size(), (leader + 2) % c.Size()}
	for _, i := range frozen {
		if err := c.Pause(i); err != nil {
			t.Fatal(err)
		}
	}
	lock := ozk.NewLock(holder, "/orphan/lock", acl)
	lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
	err = lock.LockContext(lctx)
	lcancel()
	if err == nil {
		t.Fatal("a lock taken with no quorum")
	}
	t.Logf("the attempt without a quorum: %v", err)
	for _, i := range frozen {
		if err := c.Resume(i); err != nil {
			t.Fatal(err)
		}
	}
	// The other Conn takes the lock: an orphan node would hold it off for
	// as long as the holder's session lives (over 60 s, measured without
	// the sweep); the sweep looks every second.
	lock2 := ozk.NewLock(other, "/orphan/lock", acl)
	l2ctx, l2cancel := context.WithTimeout(ctx, 20*time.Second)
	defer l2cancel()
	start := time.Now()
	if err := lock2.LockContext(l2ctx); err != nil {
		children, _, _ := other.ChildrenContext(ctx, "/orphan/lock")
		t.Fatalf("the other Conn could not take the lock: %v (lock nodes %v)", err, children)
	}
	t.Logf("the other Conn took the lock %v after the resume", time.Since(start).Round(time.Millisecond))
	if err := lock2.Unlock(); err != nil {
		t.Fatal(err)
	}
}
