package zk

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/router"
)

// Each call has go-zookeeper's shape; the ...Context variant bounds it by
// ctx (go-zookeeper's calls have no deadline of their own).

type getResult struct {
	data []byte
	stat *zk.Stat
	ch   <-chan zk.Event
}

type childrenResult struct {
	children []string
	stat     *zk.Stat
	ch       <-chan zk.Event
}

type existsResult struct {
	ok   bool
	stat *zk.Stat
	ch   <-chan zk.Event
}

// Get returns a znode's data and stat: a linearizable read unless
// WithStaleReads.
func (c *Conn) Get(path string) ([]byte, *zk.Stat, error) {
	return c.GetContext(context.Background(), path)
}

// GetContext is Get bounded by ctx.
func (c *Conn) GetContext(ctx context.Context, path string) ([]byte, *zk.Stat, error) {
	r, err := read(c, ctx, path, func(z *zk.Conn) (getResult, error) {
		d, s, err := z.Get(path)
		return getResult{d, s, nil}, err
	})
	return r.data, r.stat, err
}

// GetW is Get that also sets a data watch. The watch lives on the session
// that served the read; see the package doc for what happens to it when
// that server goes away.
func (c *Conn) GetW(path string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	return c.GetWContext(context.Background(), path)
}

// GetWContext is GetW bounded by ctx.
func (c *Conn) GetWContext(ctx context.Context, path string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	r, err := read(c, c.noHedge(ctx), path, func(z *zk.Conn) (getResult, error) {
		c.watching(z)
		d, s, ch, err := z.GetW(path)
		return getResult{d, s, ch}, err
	})
	return r.data, r.stat, r.ch, err
}

// Exists reports whether a znode exists.
func (c *Conn) Exists(path string) (bool, *zk.Stat, error) {
	return c.ExistsContext(context.Background(), path)
}

// ExistsContext is Exists bounded by ctx.
func (c *Conn) ExistsContext(ctx context.Context, path string) (bool, *zk.Stat, error) {
	r, err := read(c, ctx, path, func(z *zk.Conn) (existsResult, error) {
		ok, s, err := z.Exists(path)
		return existsResult{ok, s, nil}, err
	})
	return r.ok, r.stat, err
}

// ExistsW is Exists that also sets a watch.
func (c *Conn) ExistsW(path string) (bool, *zk.Stat, <-chan zk.Event, error) {
	return c.ExistsWContext(context.Background(), path)
}

// ExistsWContext is ExistsW bounded by ctx.
func (c *Conn) ExistsWContext(ctx context.Context, path string) (bool, *zk.Stat, <-chan zk.Event, error) {
	r, err := read(c, c.noHedge(ctx), path, func(z *zk.Conn) (existsResult, error) {
		c.watching(z)
		ok, s, ch, err := z.ExistsW(path)
		return existsResult{ok, s, ch}, err
	})
	return r.ok, r.stat, r.ch, err
}

// Children returns a znode's children.
func (c *Conn) Children(path string) ([]string, *zk.Stat, error) {
	return c.ChildrenContext(context.Background(), path)
}

// ChildrenContext is Children bounded by ctx.
func (c *Conn) ChildrenContext(ctx context.Context, path string) ([]string, *zk.Stat, error) {
	r, err := read(c, ctx, path, func(z *zk.Conn) (childrenResult, error) {
		ch, s, err := z.Children(path)
		return childrenResult{ch, s, nil}, err
	})
	return r.children, r.stat, err
}

// ChildrenW is Children that also sets a child watch.
func (c *Conn) ChildrenW(path string) ([]string, *zk.Stat, <-chan zk.Event, error) {
	return c.ChildrenWContext(context.Background(), path)
}

// ChildrenWContext is ChildrenW bounded by ctx.
func (c *Conn) ChildrenWContext(ctx context.Context, path string) ([]string, *zk.Stat, <-chan zk.Event, error) {
	r, err := read(c, c.noHedge(ctx), path, func(z *zk.Conn) (childrenResult, error) {
		c.watching(z)
		children, s, ch, err := z.ChildrenW(path)
		return childrenResult{children, s, ch}, err
	})
	return r.children, r.stat, r.ch, err
}

// GetACL returns a znode's ACL.
func (c *Conn) GetACL(path string) ([]zk.ACL, *zk.Stat, error) {
	return c.GetACLContext(context.Background(), path)
}

// GetACLContext is GetACL bounded by ctx.
func (c *Conn) GetACLContext(ctx context.Context, path string) ([]zk.ACL, *zk.Stat, error) {
	type aclResult struct {
		acl  []zk.ACL
		stat *zk.Stat
	}
	r, err := read(c, ctx, path, func(z *zk.Conn) (aclResult, error) {
		a, s, err := z.GetACL(path)
		return aclResult{a, s}, err
	})
	return r.acl, r.stat, err
}

// Sync asks the server of a routed session to catch up with the leader.
// Reads already do this unless WithStaleReads; it is here for code that
// calls it.
func (c *Conn) Sync(path string) (string, error) {
	return c.SyncContext(context.Background(), path)
}

// SyncContext is Sync bounded by ctx.
func (c *Conn) SyncContext(ctx context.Context, path string) (string, error) {
	return route(c, ctx, router.LinearizableRead, 1, nil, func(z *zk.Conn) (string, error) { return z.Sync(path) })
}

// isEphemeral reports whether a create's flags bind the node to the session.
func isEphemeral(flags int32) bool {
	return flags == zk.FlagEphemeral || flags == zk.FlagEphemeralSequential
}

// Create creates a znode. An ephemeral one is created on the primary
// session, which owns the Conn's ephemerals.
func (c *Conn) Create(path string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	return c.CreateContext(context.Background(), path, data, flags, acl)
}

// CreateContext is Create bounded by ctx.
func (c *Conn) CreateContext(ctx context.Context, path string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	return write(c, ctx, isEphemeral(flags), func(z *zk.Conn) (string, error) {
		return z.Create(path, data, flags, acl)
	})
}

// CreateProtectedEphemeralSequential is go-zookeeper's protected create of
// an ephemeral sequential node (it finds its node again after a lost
// answer), on the primary session.
func (c *Conn) CreateProtectedEphemeralSequential(path string, data []byte, acl []zk.ACL) (string, error) {
	return c.CreateProtectedEphemeralSequentialContext(context.Background(), path, data, acl)
}

// CreateProtectedEphemeralSequentialContext is
// CreateProtectedEphemeralSequential bounded by ctx.
func (c *Conn) CreateProtectedEphemeralSequentialContext(ctx context.Context, path string, data []byte, acl []zk.ACL) (string, error) {
	return write(c, ctx, true, func(z *zk.Conn) (string, error) {
		return z.CreateProtectedEphemeralSequential(path, data, acl)
	})
}

// CreateContainer creates a container znode (flags zk.FlagContainer, as
// go-zookeeper asks): the servers delete it at their first check
// (znode.container.checkIntervalMs, 60 s by default) after its last child
// is gone; one that never had a child stays. ZooKeeper hides the kind from
// clients' stats (ephemeral owner 0). Not bound to the session:
// routed as a write. Other flags fail with an error wrapping
// zk.ErrInvalidFlags, sent nowhere.
func (c *Conn) CreateContainer(path string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	return c.CreateContainerContext(context.Background(), path, data, flags, acl)
}

// CreateContainerContext is CreateContainer bounded by ctx.
func (c *Conn) CreateContainerContext(ctx context.Context, path string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	if flags != zk.FlagContainer {
		return "", fmt.Errorf("oproute/zk: CreateContainer with flags %d, want zk.FlagContainer: %w", flags, zk.ErrInvalidFlags)
	}
	return write(c, ctx, false, func(z *zk.Conn) (string, error) {
		return z.CreateContainer(path, data, flags, acl)
	})
}

// CreateTTL creates a znode (flags zk.FlagTTL, or
// zk.FlagPersistentSequentialWithTTL for a sequential one) that the
// servers delete at a check (znode.container.checkIntervalMs, 60 s by
// default) once it has no child and its last change is older than ttl.
// The servers must allow extended types (zookeeper.extendedTypesEnabled):
// else they refuse it as unimplemented, an error go-zookeeper has no
// value for ("unknown error: -6"). Not bound to the session: routed as a
// write. Other flags fail with an error wrapping zk.ErrInvalidFlags, sent
// nowhere.
func (c *Conn) CreateTTL(path string, data []byte, flags int32, acl []zk.ACL, ttl time.Duration) (string, error) {
	return c.CreateTTLContext(context.Background(), path, data, flags, acl, ttl)
}

// CreateTTLContext is CreateTTL bounded by ctx.
func (c *Conn) CreateTTLContext(ctx context.Context, path string, data []byte, flags int32, acl []zk.ACL, ttl time.Duration) (string, error) {
	if flags != zk.FlagTTL && flags != zk.FlagPersistentSequentialWithTTL {
		return "", fmt.Errorf("oproute/zk: CreateTTL with flags %d, want zk.FlagTTL or zk.FlagPersistentSequentialWithTTL: %w", flags, zk.ErrInvalidFlags)
	}
	return write(c, ctx, false, func(z *zk.Conn) (string, error) {
		return z.CreateTTL(path, data, flags, acl, ttl)
	})
}

// Set writes a znode's data if its version matches (-1 for any).
func (c *Conn) Set(path string, data []byte, version int32) (*zk.Stat, error) {
	return c.SetContext(context.Background(), path, data, version)
}

// SetContext is Set bounded by ctx.
func (c *Conn) SetContext(ctx context.Context, path string, data []byte, version int32) (*zk.Stat, error) {
	st, err := write(c, ctx, false, func(z *zk.Conn) (*zk.Stat, error) { return z.Set(path, data, version) })
	if err == nil && st != nil {
		// The write's zxid carries the epoch of the leader that committed
		// it: a newer one than the probes showed means a new leader.
		c.r.Backend().ObserveTerm(uint64(st.Mzxid) >> 32)
	}
	return st, err
}

// Delete deletes a znode if its version matches (-1 for any).
func (c *Conn) Delete(path string, version int32) error {
	return c.DeleteContext(context.Background(), path, version)
}

// DeleteContext is Delete bounded by ctx.
func (c *Conn) DeleteContext(ctx context.Context, path string, version int32) error {
	_, err := write(c, ctx, false, func(z *zk.Conn) (struct{}, error) { return struct{}{}, z.Delete(path, version) })
	return err
}

// SetACL replaces a znode's ACL if its ACL version matches (-1 for any).
func (c *Conn) SetACL(path string, acl []zk.ACL, version int32) (*zk.Stat, error) {
	return c.SetACLContext(context.Background(), path, acl, version)
}

// SetACLContext is SetACL bounded by ctx.
func (c *Conn) SetACLContext(ctx context.Context, path string, acl []zk.ACL, version int32) (*zk.Stat, error) {
	return write(c, ctx, false, func(z *zk.Conn) (*zk.Stat, error) { return z.SetACL(path, acl, version) })
}

// Multi applies ops (*zk.CreateRequest, *zk.SetDataRequest,
// *zk.DeleteRequest, *zk.CheckVersionRequest) atomically. When it fails,
// the ops not applied because another op failed report ErrMultiRolledBack.
func (c *Conn) Multi(ops ...any) ([]zk.MultiResponse, error) {
	return c.MultiContext(context.Background(), ops...)
}

// MultiContext is Multi bounded by ctx.
func (c *Conn) MultiContext(ctx context.Context, ops ...any) ([]zk.MultiResponse, error) {
	bound := false
	for _, op := range ops {
		if cr, ok := op.(*zk.CreateRequest); ok && isEphemeral(cr.Flags) {
			bound = true
		}
	}
	res, err := write(c, ctx, bound, func(z *zk.Conn) ([]zk.MultiResponse, error) { return z.Multi(ops...) })
	for i := range res {
		if e := res[i].Error; e != nil && strings.HasSuffix(e.Error(), "unknown error: -2") {
			res[i].Error = ErrMultiRolledBack
		}
	}
	return res, err
}

// AddAuth adds credentials to every session of the Conn, present and
// future. The primary session adds them before AddAuth returns (its answer
// is AddAuth's error); every other session adds them before its next
// request, and go-zookeeper resends them on each reconnect. A connection
// cut meanwhile (a move) is retried, for at most the session timeout.
func (c *Conn) AddAuth(scheme string, auth []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.sessionTimeout)
	defer cancel()
	return c.AddAuthContext(ctx, scheme, auth)
}

// AddAuthContext is AddAuth bounded by ctx.
func (c *Conn) AddAuthContext(ctx context.Context, scheme string, auth []byte) error {
	if err := c.check(ctx); err != nil {
		return err
	}
	c.authMu.Lock()
	defer c.authMu.Unlock()
	p := c.primary
	if err := p.lockAuth(ctx); err != nil {
		return err
	}
	defer p.unlockAuth()
	cred := authCred{scheme, auth}
	for {
		err := p.addPendingAuth(ctx)
		if err == nil {
			err = p.addAuth(ctx, cred)
		}
		if err == nil {
			break
		}
		if !isMemberFault(err) || c.check(ctx) != nil {
			return c.finalErr(err)
		}
		select { // the connection was cut: try again once it is back
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	c.credsMu.Lock()
	c.creds = append(c.creds, cred)
	c.credCount.Store(int32(len(c.creds)))
	c.credsMu.Unlock()
	p.authed.Add(1)
	return nil
}

// Reconfig replaces the ensemble's membership with members (server.N=…
// lines as ZooKeeper's reconfig takes them) if its configuration version
// is version (the hex version= of /zookeeper/config; -1 for any). The
// servers must have reconfigEnabled, else it fails with
// zk.ErrReconfigDisabled, and the caller needs WRITE on /zookeeper/config
// (read-only to all by default: a superuser, or servers with skipACL),
// else zk.ErrNoAuth. Routed as a write, to the leader. The Conn's own
// server list follows only with WithEnsembleTracking or SetServers.
func (c *Conn) Reconfig(members []string, version int64) (*zk.Stat, error) {
	return c.ReconfigContext(context.Background(), members, version)
}

// ReconfigContext is Reconfig bounded by ctx.
func (c *Conn) ReconfigContext(ctx context.Context, members []string, version int64) (*zk.Stat, error) {
	return write(c, ctx, false, func(z *zk.Conn) (*zk.Stat, error) { return z.Reconfig(members, version) })
}

// IncrementalReconfig adds the joining servers (server.N=… lines) to the
// ensemble and removes the leaving ones (by server ID), as Reconfig does
// for a whole membership.
func (c *Conn) IncrementalReconfig(joining, leaving []string, version int64) (*zk.Stat, error) {
	return c.IncrementalReconfigContext(context.Background(), joining, leaving, version)
}

// IncrementalReconfigContext is IncrementalReconfig bounded by ctx.
func (c *Conn) IncrementalReconfigContext(ctx context.Context, joining, leaving []string, version int64) (*zk.Stat, error) {
	return write(c, ctx, false, func(z *zk.Conn) (*zk.Stat, error) { return z.IncrementalReconfig(joining, leaving, version) })
}
