package zk

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// Lock is go-zookeeper's mutual exclusion lock recipe (zk.Lock) on a Conn,
// with the same contract (and node names: _c_<guid>-lock-<seq>): the lock is the lowest ephemeral sequential node
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
	// abandoned are the names of creates that gave up unconfirmed: sent
	// again once the session reconnects, each would make a node that takes
	// the lock for nobody. Each attempt removes any it finds.
	abandoned []string
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
		err = l.wait(ctx, path, seq)
	}
	if err != nil {
		// Our node would take the lock later, for nobody: remove it.
		return errors.Join(err, l.remove(path))
	}
	l.seq, l.lockPath = seq, path
	return nil
}

// create makes the lock's node, and its parents when missing. The node's
// name carries a GUID of ours (as go-zookeeper's protected create does), so
// that a create whose answer was lost is found again, and one that failed
// is removed if it was applied after all. The create is not abandoned with
// ctx (a create going on in the background would leave a node that takes
// the lock for nobody): it is bounded by the session timeout.
func (l *Lock) create(ctx context.Context, data []byte) (string, error) {
	var guid [16]byte
	if _, err := rand.Read(guid[:]); err != nil {
		return "", err
	}
	name := fmt.Sprintf("_c_%x-lock-", guid)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.sessionTimeout)
	defer cancel()
	var err error
	for range 3 {
		var path string
		path, err = l.c.CreateContext(cctx, l.path+"/"+name, data, zk.FlagEphemeralSequential, l.acl)
		switch {
		case err == nil:
			if ctx.Err() != nil {
				return "", errors.Join(ctx.Err(), l.remove(path))
			}
			return path, nil
		case err == zk.ErrNoNode:
			if err = l.createParents(cctx); err != nil {
				return "", err
			}
			continue
		case isMemberFault(err):
			// The answer was lost: the node may exist.
			if path, ok := l.find(cctx, name); ok {
				return path, nil
			}
			continue
		}
		break
	}
	// Applied after all? Then it must go.
	if path, ok := l.find(cctx, name); ok {
		return "", errors.Join(err, l.remove(path))
	}
	// Unanswered (a member fault, or no answer within the session
	// timeout) on a live session: go-zookeeper may still send the create
	// once the session reconnects, or the leader commit it once it has a
	// quorum, and the node would take the lock for nobody while the
	// session lives. Looked for in the background for a while, and by
	// every later attempt of this Lock. A refusal (no auth, a bad ACL) or
	// a closed or expired Conn leaves no node to look for.
	if (isMemberFault(err) || errors.Is(err, context.DeadlineExceeded)) && l.c.check(context.Background()) == nil {
		// The last few are kept: older ones the background sweep covers.
		l.abandoned = append(l.abandoned[max(0, len(l.abandoned)-15):], name)
		l.c.startBackground(func() { l.c.sweepOrphan(l.path, name) })
	}
	return "", err
}

// orphanSweep bounds the background look for an abandoned create's nodes:
// a session outlives an election of up to its timeout, and a reconnection
// sends what was queued.
func orphanSweep(sessionTimeout time.Duration) time.Duration {
	return max(30*time.Second, 4*sessionTimeout)
}

// sweepOrphan removes the lock nodes of an abandoned create (name, under
// path: up to one per try of the create), looking every second until
// orphanSweep ends or the Conn closes.
func (c *Conn) sweepOrphan(path, name string) {
	l := &Lock{c: c, path: path}
	end := time.Now().Add(orphanSweep(c.sessionTimeout))
	for time.Now().Before(end) {
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(time.Second):
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.sessionTimeout)
		nodes, _ := l.named(ctx, name)
		cancel()
		for _, node := range nodes {
			l.remove(node) // a failure leaves it to the next look, or the Lock's next attempt
		}
	}
}

func (l *Lock) createParents(ctx context.Context) error {
	pth := ""
	for _, p := range strings.Split(l.path, "/")[1:] {
		pth += "/" + p
		if _, err := l.c.CreateContext(ctx, pth, []byte{}, 0, l.acl); err != nil && err != zk.ErrNodeExists {
			return err
		}
	}
	return nil
}

// find returns the lock node whose name starts with name, if any.
func (l *Lock) find(ctx context.Context, name string) (string, bool) {
	nodes, _ := l.named(ctx, name)
	if len(nodes) == 0 {
		return "", false
	}
	return nodes[0], true
}

// named returns the lock nodes whose names start with name (a create tried
// more than once may have made several), read linearizably.
func (l *Lock) named(ctx context.Context, name string) ([]string, error) {
	children, _, err := l.c.ChildrenContext(linearizable(ctx), l.path)
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, p := range children {
		if strings.HasPrefix(p, name) {
			nodes = append(nodes, l.path+"/"+p)
		}
	}
	return nodes, nil
}

// wait returns once our node (path, seq) is the lowest under the lock's
// path. If our node is gone (the primary session expired, or someone
// deleted it) it fails: going on could make two holders.
func (l *Lock) wait(ctx context.Context, path string, seq int) error {
	own := path[strings.LastIndexByte(path, '/')+1:]
	guid := own[:strings.Index(own, "-lock-")+len("-lock-")]
	for {
		children, _, err := l.c.ChildrenContext(ctx, l.path)
		if err != nil {
			return err
		}
		prev, prevSeq, present := "", -1, false
		for _, p := range children {
			if p == own {
				present = true
				continue
			}
			if strings.HasPrefix(p, guid) || l.isAbandoned(p) {
				// A create of ours whose answer was lost, applied after we
				// looked for it, or one an earlier attempt gave up on: it
				// would make us wait for ourselves.
				if err := l.remove(l.path + "/" + p); err != nil {
					return err
				}
				continue
			}
			s, err := lockSeq(p)
			if err != nil {
				return err
			}
			if s < seq && s > prevSeq {
				prev, prevSeq = p, s
			}
		}
		if !present {
			return fmt.Errorf("oproute/zk: lock node %s is gone (session expired?): %w", path, zk.ErrNoNode)
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
			// Deleted, or the watch ended (its session expired): look again.
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// isAbandoned reports whether the lock node named p is an abandoned
// create's of this Lock.
func (l *Lock) isAbandoned(p string) bool {
	for _, name := range l.abandoned {
		if strings.HasPrefix(p, name) {
			return true
		}
	}
	return false
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

// Path returns the lock's node while it is held, "" otherwise.
func (l *Lock) Path() string { return l.lockPath }

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
