package etcd_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/oproute/oproute/backends/etcd/etcdtest"
	"github.com/oproute/oproute/conformance"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/testbed"
)

func TestMain(m *testing.M) {
	testutil.MainSkippingExamplesInQuickTier()
	testbed.CloseAllBeforeTimeout()
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) { conformance.Run(t, etcdtest.Harness{}) }
