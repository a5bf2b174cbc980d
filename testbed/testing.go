package testbed

import (
	"context"
	"testing"
	"time"
)

// StartEtcdT starts a cluster for a test, fails the test if it cannot, and
// closes it when the test ends.
func StartEtcdT(tb testing.TB, opts EtcdOptions) *EtcdCluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartEtcd(ctx, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}
