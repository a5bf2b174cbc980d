package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the benchmark's clusters, clients and stores end
// with their runs.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
