//go:build race

package testbed

// raceEnabled: this binary is race-instrumented; members must not be.
const raceEnabled = true
