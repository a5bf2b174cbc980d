package zk

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// Lock is go-zookeeper's mutual exclusion lock recipe (zk.Lock) on a Conn,
// with the same contract: the lock is the lowest ephemeral sequential node
// under its path; a contender waits for the node just before its own to go.
// Its node is created on the primary session, so it is held as long as that
// session lives (a leader change or a lost server the session outlives
// keeps it); the Conn's StateExpired event means it is lost. Its reads are
// linearizable whatever the Conn's read mode: a stale list of contenders
// could let two of them hold the lock.
type Lock struct {
	c        *Conn
	path     string
	acl      []zk.ACL
	lockPath string
	seq      int
}

// NewLock returns a lock on path, a node used by this lock only, as
// zk.NewLock does. It starts unlocked.
func NewLock(c *Conn, path string, acl []zk.ACL) *Lock {
	return &Lock{c: c, path: path, acl: acl}
}

// Lock acquires the lock, waiting as long as it takes.
func (l *Lock) Lock() error { return l.LockWithDataContext(context.Background(), []byte{}) }

// LockWithData acquires the lock, with data in its node.
func (l *Lock) LockWithData(data []byte) error {
	return l.LockWithDataContext(context.Background(), data)
}

// LockContext acquires the lock or fails when ctx ends; its node is then
// removed, so that it does not take the lock later.
func (l *Lock) LockContext(ctx context.Context) error {
	return l.LockWithDataContext(ctx, []byte{})
}

// LockWithDataContext is LockWithData bounded by ctx. It returns
// zk.ErrDeadlock if this Lock is held already.
func (l *Lock) LockWithDataContext(ctx context.Context, data []byte) error {
	if l.lockPath != "" {
		return zk.ErrDeadlock
	}
	ctx = linearizable(ctx)
	path, err := l.create(ctx, data)
	if err != nil {
		return err
	}
	seq, err := lockSeq(path)
	if err == nil {
		err = l.wait(ctx, seq)
	}
	if err != nil {
		// Our node would take the lock later, for nobody: remove it.
		l.remove(path)
		return err
	}
	l.seq, l.lockPath = seq, path
	return nil
}

// create makes the lock's node, and its parents when missing.
func (l *Lock) create(ctx context.Context, data []byte) (string, error) {
	prefix := l.path + "/lock-"
	for range 3 {
		path, err := l.c.CreateProtectedEphemeralSequentialContext(ctx, prefix, data, l.acl)
		if err != zk.ErrNoNode {
			return path, err
		}
		pth := ""
		for _, p := range strings.Split(l.path, "/")[1:] {
			pth += "/" + p
			if _, err := l.c.CreateContext(ctx, pth, []byte{}, 0, l.acl); err != nil && err != zk.ErrNodeExists {
				return "", err
			}
		}
	}
	return "", zk.ErrNoNode
}

// wait returns once seq is the lowest node under the lock's path.
func (l *Lock) wait(ctx context.Context, seq int) error {
	for {
		children, _, err := l.c.ChildrenContext(ctx, l.path)
		if err != nil {
			return err
		}
		prev, prevSeq := "", -1
		for _, p := range children {
			s, err := lockSeq(p)
			if err != nil {
				return err
			}
			if s < seq && s > prevSeq {
				prev, prevSeq = p, s
			}
		}
		if prevSeq < 0 {
			return nil // ours is the lowest
		}
		_, _, ch, err := l.c.GetWContext(ctx, l.path+"/"+prev)
		if err == zk.ErrNoNode {
			continue
		}
		if err != nil {
			return err
		}
		select {
		case <-ch:
			// Deleted, or the watch ended (its session expired: the
			// primary's expiry is caught by the next call): look again.
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// remove deletes a lock node, trying again after a cut connection: the
// node is ours alone, so a repeated delete cannot touch anything else
// (zk.ErrNoNode then means the first one was applied).
func (l *Lock) remove(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), l.c.sessionTimeout)
	defer cancel()
	for {
		err := l.c.DeleteContext(ctx, path, -1)
		switch {
		case err == nil, err == zk.ErrNoNode:
			return nil
		case !isMemberFault(err) || l.c.check(ctx) != nil:
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("oproute/zk: unlock %s: %w", path, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Unlock releases the lock; zk.ErrNotLocked if it is not held.
func (l *Lock) Unlock() error {
	if l.lockPath == "" {
		return zk.ErrNotLocked
	}
	if err := l.remove(l.lockPath); err != nil {
		return err
	}
	l.lockPath, l.seq = "", 0
	return nil
}

// lockSeq is the sequence number of a lock node (…lock-0000000007, or the
// Python client's __LOCK__ form), as zk.Lock parses it.
func lockSeq(path string) (int, error) {
	parts := strings.Split(path, "lock-")
	if len(parts) == 1 {
		parts = strings.Split(path, "__")
	}
	n, err := strconv.Atoi(parts[len(parts)-1])
	if err != nil {
		return 0, errors.Join(fmt.Errorf("oproute/zk: lock node %q", path), err)
	}
	return n, nil
}
