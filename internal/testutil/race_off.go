//go:build !race

package testutil

// RaceEnabled: this binary is race-instrumented.
const RaceEnabled = false
