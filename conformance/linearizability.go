package conformance

import (
	"context"
	"fmt"
	"math"
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

	start := time.Now()
	since := func() int64 { return int64(time.Since(start)) }
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		failed  int
	)
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
				in := linInput{key: fmt.Sprintf("lin/k%d", rng.IntN(keys)), put: rng.IntN(2) == 0}
				octx, cancel := context.WithTimeout(ctx, opTimeout)
				op := porcupine.Operation{ClientId: w, Input: in, Call: since()}
				var err error
				if in.put {
					in.value = fmt.Sprintf("w%d-%d", w, n)
					op.Input = in
					err = cli.Put(octx, in.key, in.value)
					op.Return = since()
					if err != nil {
						op.Return = math.MaxInt64
					}
				} else {
					v, found, gerr := cli.Get(octx, in.key)
					op.Output, op.Return, err = linOutput{v, found}, since(), gerr
				}
				cancel()
				mu.Lock()
				if err != nil {
					failed++
				}
				if err == nil || in.put {
					history = append(history, op)
				}
				mu.Unlock()
			}
		})
	}
	Poll(t, 10*time.Second, "history under way", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(history) > 200
	})
	fault(t, c, leader)
	mu.Lock()
	at := len(history)
	mu.Unlock()
	Poll(t, 20*time.Second, "history after the fault", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(history) > at+300
	})
	close(stop)
	wg.Wait()

	res, info := porcupine.CheckOperationsVerbose(registerModel, history, time.Minute)
	t.Logf("%d operations (%d failed) from %d workers on %d clients: %s", len(history), failed, clients*workersPerClient, clients, res)
	switch res {
	case porcupine.Ok:
	case porcupine.Illegal:
		for _, part := range info.PartialLinearizationsOperations() {
			if len(part) > 0 {
				t.Logf("longest partial linearization of one key: %d ops", len(part[0]))
			}
		}
		t.Fatal("history is not linearizable")
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
