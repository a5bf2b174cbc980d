package testutil

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// coresLock names the abstract Unix socket (Linux: no file, released by
// the kernel when its holder ends, however it ends) that HoldCores binds;
// one per user, so that two users' runs do not wait on each other.
var coresLock = fmt.Sprintf("@oproute-saturates-cores-%d", os.Getuid())

// coresWait bounds the wait for another test binary's saturating test:
// the longest hold is the Kubernetes patch test's build of the patched
// k8s.io/apiserver's packages (some 30 s warm, a minute or two from
// empty caches); the others hold the cores for at most about 25 s. It is
// below the conformance suite's PropertyBudget (5 minutes), so that a
// wait too long fails as one.
const coresWait = 4 * time.Minute

// HoldCores is called by a test that loads the machine's cores on
// purpose (closed-loop load, a storm of reconnections), or that needs them
// free of such load: it measures CPU time or times delays of a few
// milliseconds. Among the test binaries running at once (go test's -p,
// the full tier's two lanes), one such test runs at a time, so that two loads never add up and a
// measurement is not another test's load. Lighter tests keep running
// beside it, as a busy neighbour would. The hold ends with t.
func HoldCores(t interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
}) {
	t.Helper()
	start := time.Now()
	for {
		l, err := net.Listen("unix", coresLock)
		if err == nil {
			if waited := time.Since(start); waited > time.Second {
				t.Logf("waited %v for another test binary's core-saturating test", waited.Round(time.Millisecond))
			}
			t.Cleanup(func() { l.Close() })
			return
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("holding the machine's cores: %v", err)
		}
		if time.Since(start) > coresWait {
			t.Fatalf("another test binary held the machine's cores for over %v", coresWait)
		}
		time.Sleep(50 * time.Millisecond) // polling a lock another process holds: nothing to wait on
	}
}
