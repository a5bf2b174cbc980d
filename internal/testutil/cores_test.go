package testutil

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
)

// A hold keeps every other holder out until its test ends, and then lets
// the next in.
func TestHoldCoresHoldsUntilTestEnds(t *testing.T) {
	// A lock of its own: under the shared one this test waited for the
	// other test binary's real holders (25-38 s in the full tier).
	shared := coresLock
	coresLock = fmt.Sprintf("@oproute-saturates-cores-selftest-%d", os.Getpid())
	t.Cleanup(func() { coresLock = shared })
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
	HoldCores(t) // released with the subtest: this returns at once
}
