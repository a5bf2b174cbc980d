package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

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
func testLinearizable(t *testing.T, h Harness, fault func(t *testing.T, c Cluster, leader int)) {
	c := h.NewCluster(t, 3)
	ctx := context.Background()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const clients, workersPerClient, keys = 3, 2, 4
	var clis []Client
	for range clients {
		cli := connect(t, h, c.Endpoints(), router.Hybrid)
		waitLeaderKnown(t, cli, c, leader)
		clis = append(clis, cli)
	}

	hist := NewHistory()
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
				key := fmt.Sprintf("lin/k%d", rng.IntN(keys))
				octx, cancel := context.WithTimeout(ctx, opTimeout)
				call := hist.Now()
				if rng.IntN(2) == 0 {
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
	Poll(t, 10*time.Second, "history under way", func() bool { return hist.Len() > 200 })
	fault(t, c, leader)
	at := hist.Len()
	Poll(t, 20*time.Second, "history after the fault", func() bool { return hist.Len() > at+300 })
	close(stop)
	wg.Wait()

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
