//go:build !race

package testutil

// RaceEnabled is false: this binary is not race-instrumented.
const RaceEnabled = false
