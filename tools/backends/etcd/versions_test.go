package etcd_test

import (
	"testing"

	"github.com/oproute/oproute/tools/backends/etcd/etcdtest"
	"github.com/oproute/oproute/tools/conformance"
	"github.com/oproute/oproute/tools/testbed"
)

// TestServerVersions runs the conformance suite's routing properties on
// clusters of each older etcd release the backend is held to
// (testbed.EtcdCompatVersions), built from the module proxy. Its file's
// name puts it last in the package: test.sh builds those servers in the
// background meanwhile, and from empty caches each build is minutes.
func TestServerVersions(t *testing.T) {
	for _, v := range testbed.EtcdCompatVersions {
		t.Run(v, func(t *testing.T) {
			bin := testbed.EtcdServerT(t, v)
			if got, err := testbed.EtcdServerVersion(bin); err != nil || "v"+got != v {
				t.Fatalf("the server built for %s says it is %q (%v)", v, got, err)
			}
			conformance.RunRouting(t, etcdtest.Harness{Server: bin})
		})
	}
}
