//go:build race

package sim

// raceEnabled: the race detector slows the simulation about tenfold; the
// long runs shrink to the quick tier's sizes.
const raceEnabled = true
