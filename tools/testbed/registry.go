package testbed

import (
	"flag"
	"io"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oproute/oproute/internal/testutil"
)

// open holds the clusters started and not yet closed, so that a test binary
// about to die can close them (CloseAll): a panic (a watchdog's, go test's
// -timeout) runs no Cleanup, and while the servers die with the process
// (their parent-death signal), their directories and cgroups would outlive
// it.
var open = struct {
	mu  sync.Mutex
	set map[io.Closer]struct{}
}{set: map[io.Closer]struct{}{}}

func track(c io.Closer) {
	open.mu.Lock()
	open.set[c] = struct{}{}
	open.mu.Unlock()
}

func untrack(c io.Closer) {
	open.mu.Lock()
	delete(open.set, c)
	open.mu.Unlock()
}

// CloseAll closes every cluster still open in this process. It is for a
// test binary about to end abnormally (a watchdog about to panic); a test
// closes its own clusters.
func CloseAll() {
	open.mu.Lock()
	var all []io.Closer
	for c := range open.set {
		all = append(all, c)
	}
	open.mu.Unlock()
	for _, c := range all {
		c.Close()
	}
}

// CloseAllBeforeTimeout arms CloseAll for 30 s before go test's -timeout
// (whose panic runs no Cleanup). For a TestMain, after the flags are
// parsed; it does nothing without a timeout above a minute.
func CloseAllBeforeTimeout() {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return
	}
	d, err := time.ParseDuration(f.Value.String())
	if err != nil || d <= time.Minute {
		return
	}
	time.AfterFunc(d-30*time.Second, CloseAll)
}

// Main is the TestMain of a package whose tests start clusters: in the
// quick tier its examples are skipped (they start servers and cannot skip
// themselves), clusters are closed before go test's -timeout, the shared
// ones (SharedZKT) when the tests end, and no goroutine may be left then
// (goleak).
func Main(m *testing.M) {
	testutil.MainSkippingExamplesInQuickTier()
	CloseAllBeforeTimeout()
	goleak.VerifyTestMain(closingShared{m})
}

// closingShared runs the tests, then closes the clusters they shared,
// before goleak looks for what is left.
type closingShared struct{ m *testing.M }

func (c closingShared) Run() int {
	code := c.m.Run()
	closeShared()
	return code
}
