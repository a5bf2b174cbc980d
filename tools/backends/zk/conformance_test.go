package zk_test

import (
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/tools/backends/zk/zktest"
	"github.com/oproute/oproute/tools/conformance"
	"github.com/oproute/oproute/tools/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func TestConformance(t *testing.T) { conformance.Run(t, zktest.Harness{}) }

var acl = zk.WorldACL(zk.PermAll)

// quiet is go-zookeeper's logger in these tests: silent.
type quiet = testutil.Discard
