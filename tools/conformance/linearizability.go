package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
)

// linInput is one operation of a linearizability history.
type linInput struct {
	put   bool
	key   string
	value string // for a put
}

// linOutput is a get's answer.
type linOutput struct {
	value string
	found bool
}

const absent = "\x00absent"

// registerModel is a map of registers, checked key by key: a get returns
// the last value put, or nothing before the first put.
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(linInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return absent },
	Step: func(state, input, output any) (bool, any) {
		in := input.(linInput)
		if in.put {
			return true, in.value
		}
		out := output.(linOutput)
		if !out.found {
			return state.(string) == absent, state
		}
		return out.value == state.(string), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(linInput)
		if in.put {
			return fmt.Sprintf("put(%s, %s)", in.key, in.value)
		}
		out := output.(linOutput)
		return fmt.Sprintf("get(%s) → %q found=%v", in.key, out.value, out.found)
	},
}

// testLinearizable records a history of puts and routed linearizable gets
// from several clients while fault strikes the cluster, and checks it with
// porcupine. A put that failed may or may not have happened: it is recorded
// as never returning, so the checker may place it anywhere after its call.
// A failed get tells nothing and is left out.
//
// Under HybridHedge it also checks that hedging ran (some hedged reads won)
// and never sent a write twice: the writes the members applied, by their
// own count, are at most the puts the clients issued.
func testLinearizable(t *testing.T, h Harness, c Cluster, policy string, fault func(t *testing.T, c Cluster, leader int)) {
	testutil.HoldCores(t) // six closed-loop workers
	ctx := context.Background()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const clients, workersPerClient, keys = 3, 2, 4
	var clis []Client
	for range clients {
		cli := connect(t, h, c.Endpoints(), policy)
		waitLeaderKnown(t, cli, c, leader)
		clis = append(clis, cli)
	}

	// Keys of this history alone: the model starts each one absent, and
	// the cluster may be shared with another history's.
	prefix := fmt.Sprintf("lin%d", time.Now().UnixNano())
	hist := NewHistory()
	var puts atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range clients * workersPerClient {
		cli := clis[w%clients]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for n := 0; n < 5000; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("%s/k%d", prefix, rng.IntN(keys))
				octx, cancel := context.WithTimeout(ctx, opTimeout)
				call := hist.Now()
				if rng.IntN(2) == 0 {
					puts.Add(1)
					value := fmt.Sprintf("w%d-%d", w, n)
					hist.Put(w, key, value, call, cli.Put(octx, key, value))
				} else {
					v, found, err := cli.Get(octx, key)
					hist.Get(w, key, v, found, call, err)
				}
				cancel()
			}
		})
	}
	under := 200
	if policy == HybridHedge {
		// Hedging starts once each client has seen 100 reads (MinReads).
		under = 1500
	}
	testutil.Poll(t, 10*time.Second, "history under way", func() bool { return hist.Len() > under })
	// Every member session and connection is open by now: from here on,
	// the members' write counts are the clients' puts alone.
	puts0, served0 := puts.Load(), servedAll(t, c)
	fault(t, c, leader)
	at := hist.Len()
	testutil.Poll(t, 20*time.Second, "history after the fault", func() bool { return hist.Len() > at+300 })
	close(stop)
	wg.Wait()
	if policy == HybridHedge {
		var hedges router.HedgeStats
		for _, cli := range clis {
			hedges.Sent += cli.Stats().Hedges.Sent
			hedges.Won += cli.Stats().Hedges.Won
		}
		applied := uint64(0)
		for _, d := range delta(servedAll(t, c), served0) {
			applied += d.Writes
		}
		// Puts under way when the count began may land in it: one per worker.
		issued := uint64(puts.Load()-puts0) + clients*workersPerClient
		t.Logf("hedges: %d sent, %d won; members applied %d writes for at most %d puts", hedges.Sent, hedges.Won, applied, issued)
		if hedges.Won == 0 {
			t.Error("no hedged read won: the stalls did not exercise hedging")
		}
		if applied > issued {
			t.Errorf("members applied %d writes, more than the %d puts issued: a write was sent twice", applied, issued)
		}
	}

	res, longest := hist.Check(time.Minute)
	t.Logf("%d operations (%d failed) from %d workers on %d clients: %s", hist.Len(), hist.Failed(), clients*workersPerClient, clients, res)
	switch res {
	case porcupine.Ok:
	case porcupine.Illegal:
		t.Fatalf("history is not linearizable (longest partial linearization of one key: %d ops)", longest)
	default:
		t.Fatal("linearizability check did not finish within a minute")
	}
}

func leaderChangeFault(t *testing.T, c Cluster, leader int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.MoveLeader(ctx, (leader+1)%3); err != nil {
		t.Fatal(err)
	}
}

func degradedFault(t *testing.T, c Cluster, leader int) {
	c.Degrade((leader+1)%3, 8*time.Millisecond, 2*time.Millisecond)
}

// stallFault freezes the same-zone follower (SIGSTOP) for 300 ms five
// times, 300 ms apart: reads caught there are what hedges are for.
func stallFault(t *testing.T, c Cluster, leader int) {
	slow := (leader + 1) % 3
	for range 5 {
		if err := c.Pause(slow); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // the stall itself
		if err := c.Resume(slow); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // fast between stalls
	}
}
