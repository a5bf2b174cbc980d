package testbed

import (
	"context"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"
)

// StartEtcdT starts a cluster for a test, fails the test if it cannot, and
// closes it when the test ends. In the quick tier (go test -short) it skips
// the test instead.
func StartEtcdT(tb testing.TB, opts EtcdOptions) *EtcdCluster {
	tb.Helper()
	prepareT(tb)
	return startT(tb, func(ctx context.Context) (*EtcdCluster, error) { return StartEtcd(ctx, opts) })
}

// StartZKT starts an ensemble for a test, fails the test if it cannot, and
// closes it when the test ends; when the test failed, its log first shows
// each server's last 20 ERROR lines. In the quick tier (go test -short) it
// skips the test instead.
func StartZKT(tb interface {
	Helper()
	Fatal(...any)
	Skip(...any)
	Cleanup(func())
}, opts ZKOptions) *ZKCluster {
	tb.Helper()
	prepareT(tb)
	return startT(tb, func(ctx context.Context) (*ZKCluster, error) { return StartZK(ctx, opts) })
}

// startT starts a cluster within two minutes for a test, fails the test if
// it cannot, and closes the cluster when the test ends.
func startT[C interface{ Close() error }](tb interface {
	Helper()
	Fatal(...any)
	Cleanup(func())
}, start func(context.Context) (C, error)) C {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := start(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if f, ok := tb.(failedLogger); ok && f.Failed() {
			if e, ok := any(c).(interface{ serverErrors() string }); ok {
				f.Logf("%s", e.serverErrors())
			}
		}
		c.Close()
	})
	return c
}

// failedLogger is the part of testing.TB that startT uses, when it has it,
// to show a failed test what the servers logged.
type failedLogger interface {
	Failed() bool
	Logf(format string, args ...any)
}

// prepareT skips tb in the quick tier, and otherwise builds the member
// binary before a cluster's start timeout begins: a cold build takes
// minutes and must not eat it.
func prepareT(tb interface {
	Helper()
	Fatal(...any)
	Skip(...any)
}) {
	tb.Helper()
	testutil.NeedsServers(tb)
	if _, err := memberBinary(context.Background(), ""); err != nil {
		tb.Fatal(err)
	}
}
