// Package ewma provides an exponentially weighted moving average of latencies.
//
// Each sample x updates the average v as
//
//	v ← α·x + (1−α)·v
//
// with a fixed weight α per sample (the paper's definition, α = 0.3), so the
// newest sample carries weight α and one k samples old carries α(1−α)^k. The
// first sample replaces the initial value rather than being blended into it,
// so a cold estimator reports the first real measurement instead of a guess.
//
// # Concurrency
//
// An EWMA is safe for concurrent use. Add is lock-free (a compare-and-swap
// loop on the average's bits), so it can sit on a request's completion path.
package ewma

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// DefaultAlpha is the weight of the newest sample used by the paper.
const DefaultAlpha = 0.3

// EWMA is an exponentially weighted moving average over time.Duration samples.
// The zero value is not usable; create one with New.
type EWMA struct {
	alpha float64
	bits  atomic.Uint64 // math.Float64bits of the average, in nanoseconds
	count atomic.Uint64
	_     [40]byte // one EWMA per cache line: neighbours updated by other cores must not invalidate it
}

// New returns an EWMA with weight alpha for the newest sample and initial
// value initial, reported until the first sample arrives. alpha must be in
// (0, 1].
func New(alpha float64, initial time.Duration) (*EWMA, error) {
	if !(alpha > 0 && alpha <= 1) {
		return nil, fmt.Errorf("ewma: alpha %v outside (0, 1]", alpha)
	}
	if initial < 0 {
		return nil, fmt.Errorf("ewma: negative initial value %v", initial)
	}
	e := &EWMA{alpha: alpha}
	e.bits.Store(math.Float64bits(float64(initial)))
	return e, nil
}

// Add folds one sample into the average. Negative samples count as zero.
func (e *EWMA) Add(sample time.Duration) {
	x := float64(max(sample, 0))
	first := e.count.Add(1) == 1
	for {
		old := e.bits.Load()
		next := x
		if !first {
			next = e.alpha*x + (1-e.alpha)*math.Float64frombits(old)
		}
		if e.bits.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// Value returns the current average.
func (e *EWMA) Value() time.Duration {
	return time.Duration(math.Float64frombits(e.bits.Load()))
}

// Count returns how many samples have been added since New or the last Reset.
func (e *EWMA) Count() uint64 { return e.count.Load() }

// Reset sets the average to v and the sample count to zero, so that the next
// sample replaces v.
func (e *EWMA) Reset(v time.Duration) {
	e.count.Store(0)
	e.bits.Store(math.Float64bits(float64(max(v, 0))))
}
