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
		// Each wait runs from the request that missed, so the requests'
		// own send times show the doubling whatever a busy machine does
		// to timers: a late timer lengthens a gap, never shortens the
		// next (misses' times did: 349 ms then 666 ms, for 250 and 850).
		var misses atomic.Int32
		var check atomic.Pointer[Check] // the timer's goroutine reads it
		var mu sync.Mutex
		var asked []time.Time
		c := Start(Config{QuietAfter: q, AnswerWithin: a, QuietMax: 8 * q,
			Ask: func() error {
				for check.Load() == nil {
					time.Sleep(time.Millisecond) // Start has not returned yet
				}
				mu.Lock()
				asked = append(asked, time.Unix(0, check.Load().asked.Load()))
				mu.Unlock()
				return nil
			},
			Missed: func() { misses.Add(1) }})
		check.Store(c)
		testutil.Poll(t, 10*time.Second, "four misses", func() bool { return misses.Load() >= 4 })
		c.Stop()
		mu.Lock()
		defer mu.Unlock()
		// After k misses the next request waits q·2^k from the last one,
		// up to QuietMax: 2q, 4q, 8q, 8q.
		for k := 1; k < min(len(asked), 5); k++ {
			want := min(q<<k, 8*q)
			if gap := asked[k].Sub(asked[k-1]); gap < want {
				t.Errorf("request %d came %v after the one before it, %d missed in a row; want at least %v", k, gap, k, want)
			}
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
