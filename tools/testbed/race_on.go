//go:build race

package testbed

// raceEnabled: this binary is race-instrumented; it cannot host members
// (member_server_race.go), and they must not be slowed by it.
const raceEnabled = true
