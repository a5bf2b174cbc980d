package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// load drives a client with a bounded read/write mix until stopped, at most
// maxOps operations and maxDuration, recording every acknowledged write.
type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	inflight []atomic.Int64 // per worker: start (UnixNano) of the op under way, 0 when idle

	mu        sync.Mutex
	acked     map[string]string
	writeOKAt []time.Time // completion times of successful writes
	errs      atomic.Int64
	ops       atomic.Int64
	lastErrs  []string // the latest errors, for failure messages
}

const (
	maxOps      = 200000
	maxDuration = 60 * time.Second
	opTimeout   = 2 * time.Second
)

// startLoad runs workers goroutines; each op is a read with probability
// readRatio, else a write of a fresh key under prefix.
func startLoad(t *testing.T, cli Client, workers int, readRatio float64, prefix string) *load {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), maxDuration)
	l := &load{cancel: cancel, acked: map[string]string{}, inflight: make([]atomic.Int64, workers)}
	for w := range workers {
		l.wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			defer l.inflight[w].Store(0)
			for i := 0; ctx.Err() == nil && l.ops.Add(1) <= maxOps; i++ {
				l.inflight[w].Store(time.Now().UnixNano())
				opCtx, opCancel := context.WithTimeout(ctx, opTimeout)
				var err error
				if rnd.Float64() < readRatio {
					_, _, err = cli.Get(opCtx, fmt.Sprintf("%s/seed%d", prefix, rnd.IntN(16)))
				} else {
					key, val := fmt.Sprintf("%s/w%d/%d", prefix, w, i), fmt.Sprintf("v%d-%d", w, i)
					if err = cli.Put(opCtx, key, val); err == nil {
						l.mu.Lock()
						l.acked[key] = val
						l.writeOKAt = append(l.writeOKAt, time.Now())
						l.mu.Unlock()
					}
				}
				opCancel()
				l.inflight[w].Store(0)
				if err != nil && ctx.Err() == nil {
					l.errs.Add(1)
					l.mu.Lock()
					l.lastErrs = append(l.lastErrs, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
					if len(l.lastErrs) > 5 {
						l.lastErrs = l.lastErrs[1:]
					}
					l.mu.Unlock()
					// Pace retries so a refused connection does not spin.
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
		})
	}
	t.Cleanup(l.stop)
	return l
}

func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
}

// startedBefore reports whether an operation that started before t is
// still under way.
func (l *load) startedBefore(t time.Time) bool {
	for w := range l.inflight {
		if s := l.inflight[w].Load(); s != 0 && s < t.UnixNano() {
			return true
		}
	}
	return false
}

// firstWriteAfter returns when the first write completed after t0.
func (l *load) firstWriteAfter(t0 time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, at := range l.writeOKAt {
		if at.After(t0) {
			return at, true
		}
	}
	return time.Time{}, false
}

// recentErrors returns the latest errors the load saw.
func (l *load) recentErrors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lastErrs...)
}

func (l *load) ackedWrites() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]string, len(l.acked))
	for k, v := range l.acked {
		out[k] = v
	}
	return out
}
