package kubernetes_test

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/tools/testbed"
)

// What the shared suite's routing is judged by, per member, from its own
// /metrics (testbed.ServedFromGRPC): the storage layer writes with Txn
// (creates, updates and deletes are OptimisticPut/OptimisticDelete), the
// tests' helpers with Put; it reads with Range (Get, paginated lists) and
// RangeStream (lists, from Kubernetes 1.37), both linearizable.
const rangeStream = "etcdserverpb.KV/RangeStream"

func writesIn(n map[string]uint64) uint64 {
	s := testbed.ServedFromGRPC(n)
	return s.Writes + s.Txns
}

func readsIn(n map[string]uint64) uint64 { return testbed.ServedFromGRPC(n).Reads + n[rangeStream] }

const (
	leaderShare = 0.99 // of the writes, at the leader (routed, leadership stable)
	leastReads  = 0.10 // of the reads, at each member (routed): spread, even with an ejection or two
	leastOps    = 50   // writes and reads below which a run (a filtered one) is not judged
)

// traffic tallies what the members served and which member led meanwhile.
// A write counts at the leader when the member that served it led then;
// writes served while leadership was being handed over are left out.
type traffic struct {
	c *testbed.EtcdCluster

	mu         sync.Mutex
	last       []map[string]uint64
	leader     int
	writes     []uint64 // per member
	reads      []uint64 // per member
	atLeader   uint64
	unassigned uint64 // writes served during a hand-over, or after an unasked leader change
	moves      int
	stopMover  func()
}

// watchTraffic starts the tally on c, and the leader mover with
// -move-leader. Its check stops the mover.
func watchTraffic(t *testing.T, c *testbed.EtcdCluster) *traffic {
	t.Helper()
	ctx := t.Context()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tr := &traffic{c: c, leader: leader, writes: make([]uint64, c.Size()), reads: make([]uint64, c.Size())}
	if tr.last, err = tr.counts(ctx); err != nil {
		t.Fatal(err)
	}
	tr.stopMover = func() {}
	if *moveLeaderEvery > 0 {
		tr.startMover(t, *moveLeaderEvery)
	}
	t.Cleanup(func() { tr.stopMover() })
	return tr
}

func (tr *traffic) counts(ctx context.Context) ([]map[string]uint64, error) {
	all := make([]map[string]uint64, tr.c.Size())
	for i := range all {
		n, err := tr.c.GRPCCounts(ctx, i)
		if err != nil {
			return nil, fmt.Errorf("counts: %w", err)
		}
		all[i] = n
	}
	return all, nil
}

// tally adds what each member served since the last tally; writes go to
// the leader's share only if assign (tr.leader led throughout).
func (tr *traffic) tally(ctx context.Context, assign bool) error {
	now, err := tr.counts(ctx)
	if err != nil {
		return err
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for i := range now {
		w, r := writesIn(now[i])-writesIn(tr.last[i]), readsIn(now[i])-readsIn(tr.last[i])
		tr.writes[i] += w
		tr.reads[i] += r
		switch {
		case !assign:
			tr.unassigned += w
		case i == tr.leader:
			tr.atLeader += w
		}
	}
	tr.last = now
	return nil
}

// startMover hands leadership to the next member every interval (a ticker:
// the suite's own work runs meanwhile), tallying each epoch to its leader.
func (tr *traffic) startMover(t *testing.T, every time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- tr.move(ctx, every)
	}()
	tr.stopMover = func() {
		tr.stopMover = func() {}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("leader mover: %v", err)
		}
	}
}

// move is the mover's loop; it returns nil once ctx ends, whatever the
// call it interrupted said.
func (tr *traffic) move(ctx context.Context, every time.Duration) error {
	tick := time.NewTicker(every)
	defer tick.Stop()
	fail := func(err error) error {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := tr.tally(ctx, true); err != nil {
			return fail(err)
		}
		next := (tr.leader + 1) % tr.c.Size()
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second) // MoveLeader asks again until ctx ends
		err := tr.c.MoveLeader(mctx, next)
		cancel()
		if err != nil {
			return fail(fmt.Errorf("moving the leader to m%d: %w", next, err))
		}
		if err := tr.tally(ctx, false); err != nil { // the hand-over
			return fail(err)
		}
		tr.mu.Lock()
		tr.leader, tr.moves = next, tr.moves+1
		tr.mu.Unlock()
	}
}

// check stops the mover, tallies the rest and judges: with the routed
// client, at least leaderShare of the writes at the leader (leadership
// stable only: a hand-over leaves writes in flight at the old leader) and
// at least leastReads of the reads at every member. The stock control and
// a moving leader are only reported.
func (tr *traffic) check(t *testing.T) {
	tr.stopMover()
	ctx := context.Background()
	leader, err := tr.c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// An interrupted hand-over, or an election nobody asked for: the last
	// epoch's leader is not known.
	known := leader == tr.leader
	if err := tr.tally(ctx, known); err != nil {
		t.Fatal(err)
	}

	var writes, reads uint64
	var b strings.Builder
	for i := range tr.writes {
		writes += tr.writes[i]
		reads += tr.reads[i]
		fmt.Fprintf(&b, "\n  m%d: %d writes (Txn, Put, DeleteRange), %d reads (Range, RangeStream)", i, tr.writes[i], tr.reads[i])
	}
	assigned := writes - tr.unassigned
	share := float64(tr.atLeader) / float64(max(assigned, 1))
	t.Logf("client %s, %d leader moves, leader now m%d; %.2f%% of %d assigned writes at the leader (%d not assigned: hand-overs)%s",
		*clientKind, tr.moves, leader, 100*share, assigned, tr.unassigned, b.String())
	if !known && tr.moves == 0 {
		testutil.Skip(t, fmt.Sprintf("the leader moved from m%d to m%d unasked: the writes cannot be assigned", tr.leader, leader))
	}
	if assigned < leastOps || reads < leastOps {
		if flag.Lookup("test.run").Value.String() == "" {
			t.Fatalf("%d writes and %d reads: too few to judge, in an unfiltered run", assigned, reads)
		}
		t.Skipf("%d writes and %d reads: too few to judge (a filtered run)", assigned, reads)
	}
	if *clientKind != "routed" {
		return // the control: stock clientv3 round-robins both
	}
	if tr.moves == 0 && share < leaderShare {
		t.Errorf("%.2f%% of the writes at the leader m%d, want ≥ %.0f%%", 100*share, tr.leader, 100*leaderShare)
	}
	for i, r := range tr.reads {
		if float64(r) < leastReads*float64(reads) {
			t.Errorf("m%d served %d of %d reads, want ≥ %.0f%%: reads not spread", i, r, reads, 100*leastReads)
		}
	}
}
