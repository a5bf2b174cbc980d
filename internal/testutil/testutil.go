// Package testutil holds the helpers the project's tests share: polling
// with a deadline (never a sleep standing in for synchronisation), a
// receive with a deadline, a logger that discards, the process's CPU time,
// one series' value from a Prometheus gatherer. It imports nothing of the
// project's.
package testutil

import (
	"slices"
	"syscall"
	"time"
)

// T is what the helpers need of a test: *testing.T, *testing.B, or a
// property-based test's (rapid's *T).
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Poll calls cond until it holds, failing t if within passes first, and
// returns how long it took. It polls at once, then every 1 ms doubling to
// 25 ms: a quick condition costs little, a slow one does not spin.
func Poll(t T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return PollWhy(t, within, what, func() (bool, string) { return cond(), "" })
}

// PollWhy is Poll for a condition that says why it does not hold yet: the
// last reason is in the failure.
func PollWhy(t T, within time.Duration, what string, cond func() (ok bool, why string)) time.Duration {
	t.Helper()
	start := time.Now()
	step := time.Millisecond
	for {
		ok, why := cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > within {
			if why != "" {
				t.Fatalf("%s: not within %v (last: %s)", what, within, why)
			}
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(step)
		step = min(2*step, 25*time.Millisecond)
	}
}

// Discard is a logger (go-zookeeper's zk.Logger) that prints nothing.
type Discard struct{}

// Printf discards its arguments.
func (Discard) Printf(string, ...any) {}

// ProcessCPU is the CPU time (user and system) this process has used, 0 if
// the system does not say.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// MedianTime runs op n times and returns the median of their durations,
// failing t on op's first error.
func MedianTime(t T, n int, op func() error) time.Duration {
	t.Helper()
	ds := Times(t, n, op)
	slices.Sort(ds)
	return ds[n/2]
}

// Times runs op n times and returns how long each took, failing t on an
// error.
func Times(t T, n int, op func() error) []time.Duration {
	t.Helper()
	ds := make([]time.Duration, n)
	for i := range ds {
		start := time.Now()
		if err := op(); err != nil {
			t.Fatalf("%v", err)
		}
		ds[i] = time.Since(start)
	}
	return ds
}

// Until returns a loop condition for a load bounded by its evidence: true
// while least has not passed since the call, then while enough does not
// hold and most has not passed. A starved machine takes longer to gather
// the evidence; the loop waits for it rather than judging a short window.
func Until(least, most time.Duration, enough func() bool) func() bool {
	start := time.Now()
	return func() bool {
		d := time.Since(start)
		return d < least || d < most && !enough()
	}
}

// Quantile returns the q-quantile (nearest rank) of ds, which it sorts.
func Quantile(ds []time.Duration, q float64) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// Receive returns the next value from ch, failing t if none arrives within
// the given time or ch is closed.
func Receive[V any](t T, ch <-chan V, within time.Duration, what string) V {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatalf("%s: channel closed", what)
		}
		return v
	case <-timer.C:
		t.Fatalf("%s: nothing within %v", what, within)
	}
	var none V
	return none
}
