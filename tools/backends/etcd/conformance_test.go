package etcd_test

import (
	"testing"

	"github.com/oproute/oproute/tools/backends/etcd/etcdtest"
	"github.com/oproute/oproute/tools/conformance"
	"github.com/oproute/oproute/tools/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func TestConformance(t *testing.T) { conformance.Run(t, etcdtest.Harness{}) }
