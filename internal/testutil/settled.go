package testutil

import "time"

// UnsettledProbeRate is what an unsettled client probes on 3 members: each
// of them every 250 ms round (router.DefaultProbeInterval).
const UnsettledProbeRate = 12.0

// UnsettledShare samples, every 100 ms over window, which of n clients are
// settled, and returns the share of samples in which one was not: a
// settled client on a loaded machine can be unsettled for a round or two
// by one slow or timed-out probe, and probes every round meanwhile.
func UnsettledShare(window time.Duration, n int, settled func(i int) bool) float64 {
	var samples, unsettled int
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(window); time.Now().Before(end); <-tick.C {
		for i := range n {
			samples++
			if !settled(i) {
				unsettled++
			}
		}
	}
	if samples == 0 {
		return 0
	}
	return float64(unsettled) / float64(samples)
}
