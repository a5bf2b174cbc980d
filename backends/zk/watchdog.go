package zk

import (
	"log/slog"
	"slices"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/router"
)

// watchSessions is the second line of defence against a go-zookeeper
// session that stops reconnecting (its loop blocked, as in the credential
// resend the connections guard against, or in a dial or write that ignores
// its deadline): a member session that has had no server, and whose loop
// has begun no dial and established nothing, for longer than the session
// timeout while some server serves is closed and left behind,
// and the next call on its server opens a new one. The primary session
// cannot be replaced without losing the Conn's ephemerals; after twice the
// session timeout (ZooKeeper has expired it by then, unless the server
// raised the timeout) it is treated as expired: every call returns
// zk.ErrSessionExpired, as after ZooKeeper's own expiry. A primary that
// has never been established is left alone: ZooKeeper holds nothing of it
// to expire, and a Conn started before its ensemble waits for it; it is
// told of once, so that a first handshake stuck for good is seen.
func (c *Conn) watchSessions() {
	tick := time.NewTicker(max(c.sessionTimeout/8, 100*time.Millisecond))
	defer tick.Stop()
	down := map[*session]time.Time{} // sessions without a server, since
	toldFirst := false               // a never established primary's wedge told
	for {
		select {
		case <-c.done:
			return
		case <-tick.C:
		}
		now := time.Now()
		open := c.sessions()
		serving := c.anyServes()
		for s := range down {
			switch {
			case !slices.Contains(open, s):
				delete(down, s) // left behind meanwhile
			case !serving:
				// No server serves (an election, an ensemble restart):
				// ZooKeeper keeps sessions through that, and a session
				// cannot be blamed for finding no server. Only time with
				// a server to go to counts.
				down[s] = now
			}
		}
		for _, s := range open {
			if s.zk.State() == zk.StateHasSession || (s == c.primary && c.expired.Load()) {
				delete(down, s)
				continue
			}
			since, ok := down[s]
			if !ok {
				down[s] = now
				continue
			}
			// A loop that dials or establishes the session is not stuck
			// (a storm of resets cuts every connection it makes).
			if last := time.Unix(0, s.progress.Load()); last.After(since) {
				since = last
			}
			limit := c.sessionTimeout
			if s == c.primary {
				limit *= 2
			}
			if now.Sub(since) <= limit || !serving {
				continue
			}
			if s == c.primary && !s.established.Load() {
				if !toldFirst && !c.closed.Load() {
					toldFirst = true
					c.tellWedged(s, now.Sub(since), slog.Bool("never_established", true))
				}
				continue
			}
			delete(down, s)
			c.replaceWedged(s, now.Sub(since))
		}
	}
}

func (c *Conn) anyServes() bool {
	for i := range c.servers().members {
		if c.r.Backend().Serves(i) {
			return true
		}
	}
	return false
}

func (c *Conn) replaceWedged(s *session, down time.Duration) {
	if c.closed.Load() {
		return
	}
	if s == c.primary && c.expired.Load() {
		return
	}
	c.tellWedged(s, down)
	if s == c.primary {
		// As ZooKeeper's own expiry: the event on the channel and to the
		// callback, and every later call refused.
		c.onPrimaryEvent(zk.Event{Type: zk.EventSession, State: zk.StateExpired})
		return
	}
	c.memMu.Lock()
	found := false
	for i, m := range c.mem {
		if m == s {
			c.mem[i], found = nil, true
		}
	}
	c.memMu.Unlock()
	if !found {
		return // retired and being closed meanwhile
	}
	s.kick() // a call blocked on the connection ends now
	c.bg.Go(s.close)
}

// tellWedged reports session s wedged, down without a server for so long.
func (c *Conn) tellWedged(s *session, down time.Duration, extra ...slog.Attr) {
	c.onEvent(router.Event{Kind: EventSessionWedged, Warn: true, Attrs: append([]slog.Attr{
		slog.String("session", s.name), slog.Duration("without_server", down)}, extra...)})
}

// sessions returns the primary session and the member sessions open now.
func (c *Conn) sessions() []*session {
	c.memMu.Lock()
	defer c.memMu.Unlock()
	out := []*session{c.primary}
	for _, s := range c.mem {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}
