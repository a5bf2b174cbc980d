// Package liveness asks a silent connection or stream for a sign of life.
//
// A member that stops answering while the client sends it nothing (a
// frozen process keeps its TCP connections open, so nothing fails) shows
// only silence, and silence is also what an idle stream shows. A Check
// tells them apart cheaply: when nothing has been heard for QuietAfter it
// sends a request the other side answers at once (etcd's watch progress
// request, a ZooKeeper ping), and reports a miss when nothing at all is
// heard within AnswerWithin. The wait before the next request doubles
// with each miss in a row, from the request that missed, up to QuietMax;
// anything heard resets it.
//
// # Concurrency
//
// A Check is safe for concurrent use: Heard is called from the receiving
// goroutine, the check runs on its own timer.
package liveness

import (
	"sync/atomic"
	"time"
)

// Config configures a Check. The three durations are required.
type Config struct {
	QuietAfter   time.Duration // silence before a request is sent
	AnswerWithin time.Duration // how long a request may go unanswered
	QuietMax     time.Duration // the cap of the doubling wait
	// Ask sends a request; an error ends the check (the connection or
	// stream is over, and its owner sees why).
	Ask func() error
	// Missed reports a request left unanswered.
	Missed func()
	// Ready reports whether a request may be sent now (nil: always); a
	// check not ready looks again a quarter of QuietAfter later.
	Ready func() bool
	// Over reports whether the connection or stream has ended (nil: only
	// Stop ends the check).
	Over func() bool
}

// Check is one connection's or stream's silence check.
type Check struct {
	cfg   Config
	heard atomic.Int64 // when anything was last heard (UnixNano): Heard's one store
	// The timer's own state (its runs follow one another).
	sent    atomic.Int64 // when the outstanding request was sent (UnixNano); 0 if none
	asked   atomic.Int64 // when the last request was sent (UnixNano)
	misses  atomic.Int32 // requests in a row left unanswered
	stopped atomic.Bool
	timer   atomic.Pointer[time.Timer]
}

// Start starts a check; the first request goes out after QuietAfter of
// silence.
func Start(cfg Config) *Check {
	c := &Check{cfg: cfg}
	c.heard.Store(time.Now().UnixNano())
	t := time.AfterFunc(cfg.QuietMax, c.run)
	c.timer.Store(t) // before the timer can first fire: Reset below
	t.Reset(cfg.QuietAfter)
	return c
}

// Heard notes that something arrived: the other side is alive. It is on
// the receiving path, so it only notes the time; the timer draws the rest
// from it.
func (c *Check) Heard() { c.heard.Store(time.Now().UnixNano()) }

// Stop ends the check. It is idempotent.
func (c *Check) Stop() {
	if !c.stopped.Swap(true) {
		c.timer.Load().Stop()
	}
}

// run is the timer's: it reports a miss when a request's time is up, and
// asks when the silence has lasted long enough. It rearms itself until the
// check ends.
func (c *Check) run() {
	if c.stopped.Load() || (c.cfg.Over != nil && c.cfg.Over()) {
		return
	}
	now, heard := time.Now(), c.heard.Load()
	if heard > c.asked.Load() {
		c.sent.Store(0) // answered (or something else arrived): the peer is alive
		c.misses.Store(0)
	}
	if sent := c.sent.Load(); sent != 0 {
		if due := time.Unix(0, sent).Add(c.cfg.AnswerWithin); now.Before(due) {
			c.timer.Load().Reset(due.Sub(now))
			return
		}
		c.sent.Store(0)
		c.misses.Add(1)
		c.cfg.Missed()
	}
	quiet := min(c.cfg.QuietAfter<<min(c.misses.Load(), 5), c.cfg.QuietMax)
	due := time.Unix(0, max(heard, c.asked.Load())).Add(quiet)
	if now.Before(due) || (c.cfg.Ready != nil && !c.cfg.Ready()) {
		c.timer.Load().Reset(max(due.Sub(now), c.cfg.QuietAfter/4))
		return
	}
	c.sent.Store(now.UnixNano())
	c.asked.Store(now.UnixNano())
	if err := c.cfg.Ask(); err != nil {
		return
	}
	c.timer.Load().Reset(c.cfg.AnswerWithin)
}
