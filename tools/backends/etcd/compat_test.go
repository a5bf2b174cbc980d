package etcd_test

import (
	"testing"

	"github.com/oproute/oproute/tools/backends/etcd/etcdtest"
	"github.com/oproute/oproute/tools/conformance"
	"github.com/oproute/oproute/tools/testbed"
)

// serverVersions are the etcd server releases besides the test bed's own
// (the server/v3 the tools module requires, v3.7) that the backend is held
// to: the newest patch, on the module proxy, of each minor release
// production clusters run.
var serverVersions = []string{"v3.5.36", "v3.6.17"}

// TestServerVersions runs the conformance suite's routing properties on
// clusters of each older etcd release, built from the module proxy.
func TestServerVersions(t *testing.T) {
	for _, v := range serverVersions {
		t.Run(v, func(t *testing.T) {
			bin := testbed.EtcdServerT(t, v)
			if got, err := testbed.EtcdServerVersion(bin); err != nil || "v"+got != v {
				t.Fatalf("the server built for %s says it is %q (%v)", v, got, err)
			}
			conformance.RunRouting(t, etcdtest.Harness{Server: bin})
		})
	}
}
