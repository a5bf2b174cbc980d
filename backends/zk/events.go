package zk

import (
	"log/slog"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/router"
)

// Session events, besides the router's (router.Event*).
const (
	EventSessionMoved   = "zk_session_moved"   // a session was established on another server (attrs from, to)
	EventSessionExpired = "zk_session_expired" // ZooKeeper expired a session (the primary's: its ephemerals are gone)
	// A session had no server for longer than its timeout (the primary:
	// twice that) while servers answered: replaced (a member session) or
	// treated as expired (the primary); attrs session, without_server. A
	// primary never yet established is told once, with never_established,
	// and waited for still.
	EventSessionWedged = "zk_session_wedged"
)

// eventBuffer is the capacity of the channel Connect returns; events beyond
// it are dropped, as go-zookeeper drops them (WithEventCallback does not),
// except StateExpired, for which the oldest event makes room.
const eventBuffer = 64

func (c *Conn) onPrimaryEvent(ev zk.Event) {
	if ev.Type == zk.EventSession && ev.State == zk.StateDisconnected {
		c.r.Backend().Unsettle() // the connection to the leader (or the sticky server) broke
	}
	if ev.Type == zk.EventSession && ev.State == zk.StateExpired && !c.closed.Load() {
		// go-zookeeper would now open a new session in its place, silently
		// dropping our ephemerals. Refuse: the dialer fails from here on,
		// and every call returns zk.ErrSessionExpired, as the Java client's
		// handle does; the application makes a new Conn.
		if c.expired.Swap(true) {
			return // told already (a wedged primary counted as expired)
		}
		c.sessionExpired("primary")
	}
	// The channel first: an event the callback has seen is on the channel.
	c.sendEvent(ev)
	if c.o.onEvent != nil {
		c.cbMu.Lock()
		c.cbQueue = append(c.cbQueue, ev)
		c.cbMu.Unlock()
		select {
		case c.cbWake <- struct{}{}:
		default:
		}
	}
}

// stopCallbacks ends what Connect started besides the router, when Connect
// fails before a session exists.
func (c *Conn) stopCallbacks() {
	c.cancel()
	close(c.cbStop)
	<-c.cbDone
	c.releaseProbes()
}

// dispatchCallbacks runs the callback for each queued event, in order,
// until Close has stopped the sessions and the queue is empty.
func (c *Conn) dispatchCallbacks() {
	defer close(c.cbDone)
	c.cbGID.Store(goroutineID())
	for {
		c.cbMu.Lock()
		evs := c.cbQueue
		c.cbQueue = nil
		c.cbMu.Unlock()
		for _, ev := range evs {
			c.o.onEvent(ev)
		}
		if len(evs) > 0 {
			continue
		}
		select {
		case <-c.cbWake:
		case <-c.cbStop:
			c.cbMu.Lock()
			empty := len(c.cbQueue) == 0
			c.cbMu.Unlock()
			if empty {
				return
			}
		}
	}
}

// sendEvent puts ev on the channel Connect returned, dropping it when the
// channel is full, except StateExpired, for which the oldest event makes
// room (a long outage fills the channel with connection attempts).
func (c *Conn) sendEvent(ev zk.Event) {
	c.eventsMu.Lock()
	defer c.eventsMu.Unlock()
	if c.events == nil {
		return
	}
	select {
	case c.events <- ev:
		return
	default:
	}
	if ev.State == zk.StateExpired {
		select {
		case <-c.events:
		default:
		}
		select {
		case c.events <- ev:
		default:
		}
	}
}

func (c *Conn) sessionMoved(s *session, from, to int) {
	c.moves.Add(1)
	c.onEvent(router.Event{Kind: EventSessionMoved, Attrs: []slog.Attr{
		slog.String("session", s.name), slog.String("from", c.servers().members[from].ID), slog.String("to", c.servers().members[to].ID)}})
}

func (c *Conn) sessionExpired(name string) {
	if name == "primary" {
		c.expiries[0].Add(1)
	} else {
		c.expiries[1].Add(1)
	}
	// The primary's expiry loses the Conn's ephemerals: a warning.
	c.onEvent(router.Event{Kind: EventSessionExpired, Warn: name == "primary", Attrs: []slog.Attr{slog.String("session", name)}})
}
