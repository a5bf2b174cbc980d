package testbed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A failed test shows each ZooKeeper server's last ERROR lines, and
// nothing else of the log.
func TestServerErrorsShowsLastErrorLines(t *testing.T) {
	dir := t.TempDir()
	c := &ZKCluster{servers: []*ZKServer{{Name: "z0"}, {Name: "z1"}, {Name: "z2"}}}
	c.dir = dir
	var z0 strings.Builder
	for i := range 25 {
		fmt.Fprintf(&z0, "2026-12-04 16:35:22,%03d ERROR [LearnerHandler] Leader: error %d\n", i, i)
		fmt.Fprintf(&z0, "2026-12-04 16:35:22,%03d WARN  [NIOWorkerThread-1] NIOServerCnxn: warning %d\n", i, i)
	}
	for name, log := range map[string]string{"z0": z0.String(), "z1": "2026-12-04 16:35:22,000 INFO  [main] QuorumPeer: LOOKING\n"} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "server.log"), []byte(log), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	got := c.serverErrors()
	for _, want := range []string{"z0: 25 ERROR lines", "error 5\n", "error 24\n", "z1: 0 ERROR lines", "z2: no server log"} {
		if !strings.Contains(got, want) {
			t.Errorf("serverErrors lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"error 4\n", "warning", "LOOKING"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("serverErrors has %q:\n%s", unwanted, got)
		}
	}
}

// startT logs the servers' errors before closing the cluster (which
// removes their logs) of a failed test, and only of a failed one.
func TestStartTLogsServerErrorsOfAFailedTest(t *testing.T) {
	for _, failed := range []bool{false, true} {
		tb := &recordingTB{failed: failed}
		c := startT(tb, func(context.Context) (*fakeErrCluster, error) { return &fakeErrCluster{}, nil })
		tb.cleanup()
		if !c.closed {
			t.Errorf("failed=%v: cluster not closed", failed)
		}
		if shown := strings.Contains(tb.logged, "ERROR from the servers"); shown != failed {
			t.Errorf("failed=%v: server errors logged = %v (%q)", failed, shown, tb.logged)
		}
		if strings.Contains(tb.logged, "logs removed") {
			t.Errorf("failed=%v: server errors read after Close: %q", failed, tb.logged)
		}
	}
}

type fakeErrCluster struct{ closed bool }

func (c *fakeErrCluster) Close() error { c.closed = true; return nil }
func (c *fakeErrCluster) serverErrors() string {
	if c.closed {
		return "logs removed"
	}
	return "ERROR from the servers"
}

type recordingTB struct {
	failed   bool
	logged   string
	cleanups []func()
}

func (r *recordingTB) Helper()                         {}
func (r *recordingTB) Fatal(args ...any)               { panic(fmt.Sprint(args...)) }
func (r *recordingTB) Cleanup(f func())                { r.cleanups = append(r.cleanups, f) }
func (r *recordingTB) Failed() bool                    { return r.failed }
func (r *recordingTB) Logf(format string, args ...any) { r.logged += fmt.Sprintf(format, args...) }

func (r *recordingTB) cleanup() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}
