package conformance

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oproute/oproute/internal/testutil"
)

// Metric returns the value of the one series of name whose labels include
// the given name/value pairs, from g: a counter's or gauge's value, a
// histogram's sample count. It fails t if there is none.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	return testutil.Metric(t, g, name, labels...)
}
