package zk

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/internal/override"
	"github.com/oproute/oproute/router"
)

// errNotPlaced: a call forced to a server (WithMember) found no session of
// the Conn's there; it was not sent.
var errNotPlaced = fmt.Errorf("%w: the call is forced to a server its session cannot be placed on", ErrUnreachable)

// sessionFor returns the session that serves member idx: the primary
// session while it is there (so that one server carries one session of
// ours, as with go-zookeeper's client), else the member's own session.
func (c *Conn) sessionFor(idx int) (*session, error) {
	if int(c.primary.cur.Load()) == idx {
		return c.primary, nil
	}
	c.memMu.Lock()
	defer c.memMu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if s := c.mem[idx]; s != nil {
		return s, nil
	}
	name := fmt.Sprintf("m%d", idx)
	s, err := c.newSession(name, idx, func(ev zk.Event) {
		if ev.Type == zk.EventSession && ev.State == zk.StateDisconnected {
			c.r.Backend().Unsettle() // a connection to a server broke
		}
		if ev.Type == zk.EventSession && ev.State == zk.StateExpired && !c.closed.Load() {
			c.sessionExpired(name) // go-zookeeper goes on with a new one
		}
	})
	if err != nil {
		return nil, fmt.Errorf("oproute/zk: session for %s: %w", c.servers().members[idx].ID, err)
	}
	c.mem[idx] = s
	return s, nil
}

// watching marks the session behind z as one that may hold watches (see
// replyHold), before the call that may leave one.
func (c *Conn) watching(z *zk.Conn) {
	if c.primary.zk == z {
		c.primary.watching.Store(true)
		return
	}
	c.memMu.Lock()
	defer c.memMu.Unlock()
	for _, s := range c.mem {
		if s != nil && s.zk == z {
			s.watching.Store(true)
		}
	}
}

func (c *Conn) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.closed.Load() {
		return ErrClosed
	}
	if c.expired.Load() {
		return zk.ErrSessionExpired
	}
	return nil
}

type linearizableKey struct{}

// linearizable makes the reads on ctx linearizable under WithStaleReads
// (recipes need them).
func linearizable(ctx context.Context) context.Context {
	return context.WithValue(ctx, linearizableKey{}, true)
}

// quorumCheck is the strict reads' quorum operation: it matches "/" at any
// version, so it never fails, and changes nothing.
var quorumCheck = &zk.CheckVersionRequest{Path: "/", Version: -1}

// read routes a read: a linearizable one is Sync(path) and then fn on the
// same session, which ZooKeeper orders after the sync, so the server has
// caught up with the leader as of the sync; under WithQuorumReads the sync
// is a quorum operation instead. A read that failed in transport (its
// server went away) is tried once more elsewhere. Under WithHedgedReads a
// read still unanswered after the hedge delay is sent, sync and all, on
// another server's session too, and the first answer wins.
func read[T any](c *Conn, ctx context.Context, path string, fn func(*zk.Conn) (T, error)) (T, error) {
	op, call := router.LinearizableRead, fn
	switch {
	case c.o.stale && ctx.Value(linearizableKey{}) == nil:
		op = router.StaleRead
	case c.o.quorum:
		call = func(z *zk.Conn) (T, error) {
			// An answer on the merits (a root ACL without read access) was
			// committed all the same; only a failed round trip stops the read.
			if _, err := z.Multi(quorumCheck); err != nil && outcomeOf(context.Background(), err) != router.AppError {
				var zero T
				return zero, err
			}
			return fn(z)
		}
	default:
		call = func(z *zk.Conn) (T, error) {
			if _, err := z.Sync(path); err != nil && err != zk.ErrNoNode {
				var zero T
				return zero, err
			}
			return fn(z)
		}
	}
	if !c.r.Hedging() || c.o.quorum {
		// Under WithQuorumReads a hedge would be a second proposal
		// through the leader: not a read's cost.
		return route(c, ctx, op, 2, nil, call)
	}
	return router.Hedge(ctx, c.r, op, func(ctx context.Context, hedge bool) (T, error) {
		attempts := 2
		if hedge {
			attempts = 1 // the first attempt still has its own retry
		}
		return route(c, ctx, op, attempts, nil, call)
	}, func(err error) router.Outcome { return outcomeOf(context.Background(), err) })
}

// noHedge marks a read that sets a watch: the watch lives on the session
// that served it, so the read must run on one session only.
func (c *Conn) noHedge(ctx context.Context) context.Context {
	if !c.r.Hedging() {
		return ctx
	}
	return router.WithHedging(ctx, false)
}

// write routes a write. A session-bound write (an ephemeral create) goes on
// the primary session, which owns the Conn's ephemerals. Writes are never
// retried: a write cut in transport may have been applied.
func write[T any](c *Conn, ctx context.Context, sessionBound bool, fn func(*zk.Conn) (T, error)) (T, error) {
	var bound *session
	if sessionBound {
		bound = c.primary
	}
	return route(c, ctx, router.Write, 1, bound, fn)
}

// route runs fn on the session serving the member the router picks for op
// (or on bound, counted where bound is), reports the outcome to the router
// and, up to attempts times, tries again elsewhere after a member fault.
func route[T any](c *Conn, ctx context.Context, op router.Op, attempts int, bound *session, fn func(*zk.Conn) (T, error)) (T, error) {
	var zero T
	if err := c.check(ctx); err != nil {
		return zero, err
	}
	pctx := ctx
	if bound != nil {
		// Counted where it goes; not while that server is retired (the
		// session is about to move, and a retired member takes no picks).
		if srv, cur := c.servers(), int(bound.cur.Load()); cur >= 0 && cur < len(srv.retired) && !srv.retired[cur] {
			pctx = router.WithMember(ctx, srv.members[cur].ID)
		}
	}
	var err error
	cutOnce := false // a probe-share read cut at its budget: once per call
	for attempt := 0; attempt < attempts; attempt++ {
		p, perr := c.r.Pick(pctx, op)
		if perr != nil {
			return zero, mapRouterErr(perr)
		}
		s, at := bound, -1
		if s == nil {
			if s, err = c.sessionFor(p.Index); err != nil {
				p.Abandon()
				return zero, err
			}
			if _, forced := override.Forced(ctx); forced {
				at = p.Index
				if s != c.primary && !s.reach(ctx) {
					p.Abandon()
					if err := c.check(ctx); err != nil {
						return zero, err
					}
					return zero, fmt.Errorf("%w: %s", errNotPlaced, p.Member.ID)
				}
			}
		}
		var v T
		if budget := c.r.Backend().ProbeBudget(p); budget > 0 && !cutOnce {
			// The router's probe of an ejected member: the caller pays at
			// most its budget, never a failed read.
			bctx, cancel := context.WithTimeout(ctx, budget)
			v, err = do(bctx, s, at, fn)
			cut := err != nil && bctx.Err() == context.DeadlineExceeded && ctx.Err() == nil
			cancel()
			if o := outcomeOf(ctx, err); cut || o == router.MemberFault || o == router.Overloaded {
				cutOnce = true
				if cut {
					o = router.CallerGaveUp
				}
				p.Done(o)
				if err := c.check(ctx); err != nil {
					return zero, err
				}
				attempt-- // the pool's turn is not a retry
				continue
			}
		} else {
			v, err = do(ctx, s, at, fn)
		}
		if errors.Is(err, errNotPlaced) {
			p.Abandon()
			return zero, fmt.Errorf("%w: %s", err, p.Member.ID)
		}
		o := outcomeOf(ctx, err)
		p.Done(o)
		if o != router.MemberFault || c.check(ctx) != nil {
			return v, c.finalErr(err)
		}
	}
	return zero, c.finalErr(err)
}

func (c *Conn) finalErr(err error) error {
	switch {
	case err == nil:
		return nil
	case c.closed.Load() && (errors.Is(err, zk.ErrClosing) || errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer)):
		return ErrClosed
	case c.expired.Load() && isMemberFault(err):
		return zk.ErrSessionExpired
	}
	return err
}

func mapRouterErr(err error) error {
	if errors.Is(err, router.ErrClosed) {
		return ErrClosed
	}
	return fmt.Errorf("oproute/zk: %w", err)
}
