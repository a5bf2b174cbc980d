package zk

import (
	"math/rand/v2"
	"time"
)

// jitterSpread is how far jitter moves a wait either way: as the router's
// settled probe cadence, ±20 %.
const jitterSpread = 0.2

// jitter spreads d uniformly over ±jitterSpread, so that the Conns of a
// fleet that lost their servers together do not retry in step.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (1 - jitterSpread + 2*jitterSpread*rand.Float64()))
}
