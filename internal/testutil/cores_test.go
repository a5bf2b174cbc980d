package testutil

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// A hold keeps every other holder out until its test ends, and then lets
// the next in.
func TestHoldCoresHoldsUntilTestEnds(t *testing.T) {
	t.Run("hold", func(t *testing.T) {
		HoldCores(t)
		l, err := net.Listen("unix", coresLock)
		if err == nil {
			l.Close()
			t.Fatal("a second holder got in while the first held")
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("second holder: %v, want EADDRINUSE", err)
		}
	})
	HoldCores(t) // released with the subtest: this returns (at worst after another binary's hold)
}
