package etcd_test

import (
	"testing"

	"github.com/oproute/oproute/backends/etcd/etcdtest"
	"github.com/oproute/oproute/conformance"
	"github.com/oproute/oproute/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func TestConformance(t *testing.T) { conformance.Run(t, etcdtest.Harness{}) }
