package liveness

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
)

// A silent peer that answers every request is asked about once per
// QuietAfter and never missed; one that answers nothing is missed, with
// the wait doubling per miss; an error from Ask ends the check.
func TestCheck(t *testing.T) {
	const q, a = 20 * time.Millisecond, 10 * time.Millisecond
	t.Run("answered", func(t *testing.T) {
		var asks, misses atomic.Int32
		var check atomic.Pointer[Check] // the timer's goroutine reads it
		answer := func() {
			for check.Load() == nil {
				time.Sleep(time.Millisecond) // Start has not returned yet
			}
			check.Load().Heard()
		}
		// The answer comes from a goroutine: 200 ms for it, so that a
		// starved scheduler is not a miss.
		c := Start(Config{QuietAfter: q, AnswerWithin: 200 * time.Millisecond, QuietMax: 8 * q,
			Ask:    func() error { asks.Add(1); go answer(); return nil },
			Missed: func() { misses.Add(1) }})
		check.Store(c)
		defer c.Stop()
		testutil.Poll(t, 5*time.Second, "five requests answered", func() bool { return asks.Load() >= 5 })
		if misses.Load() != 0 {
			t.Fatalf("%d misses of a peer that answers every request", misses.Load())
		}
	})
	t.Run("silent", func(t *testing.T) {
		// Gaps of 250 ms and 850 ms: a timer 175 ms late on the first
		// still shows the doubling (at 20 ms and 10 ms, 35 ms late did
		// not).
		const q, a = 100 * time.Millisecond, 50 * time.Millisecond
		var asks, misses atomic.Int32
		var mu sync.Mutex
		var at []time.Time
		c := Start(Config{QuietAfter: q, AnswerWithin: a, QuietMax: 8 * q,
			Ask: func() error { asks.Add(1); return nil },
			Missed: func() {
				mu.Lock()
				at = append(at, time.Now())
				mu.Unlock()
				misses.Add(1)
			}})
		testutil.Poll(t, 5*time.Second, "four misses", func() bool { return misses.Load() >= 4 })
		c.Stop()
		mu.Lock()
		defer mu.Unlock()
		// The gaps between misses grow: q+a, then 2q+a, 4q+a (from the request that missed).
		if g1, g3 := at[1].Sub(at[0]), at[3].Sub(at[2]); g3 < 2*g1 {
			t.Errorf("gaps between misses %v then %v: the wait did not double", g1, g3)
		}
	})
	t.Run("over", func(t *testing.T) {
		var asks atomic.Int32
		c := Start(Config{QuietAfter: q, AnswerWithin: a, QuietMax: 8 * q,
			Ask:    func() error { asks.Add(1); return errors.New("closed") },
			Missed: func() { t.Error("a miss after the check ended") }})
		defer c.Stop()
		testutil.Poll(t, 5*time.Second, "a request", func() bool { return asks.Load() == 1 })
		deadline := time.Now().Add(10 * q)
		for time.Now().Before(deadline) {
			time.Sleep(q) // watching for requests that must not come
		}
		if asks.Load() != 1 {
			t.Fatalf("%d requests after Ask failed, want the check ended", asks.Load())
		}
	})
}
