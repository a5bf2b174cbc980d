package kubernetes_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that nothing the tests start outlives them: the stores,
// their watchers and lease managers, the clients and their routers.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
