package zk

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/oproute/oproute/internal/zk4lw"
	"github.com/oproute/oproute/router"
)

// Probes are shared by the Conns of a process. A probe is one TCP
// connection to the server's client port for one srvr command; each Conn's
// router probes every server four times a second, and ZooKeeper allows a
// client address maxClientCnxns connections (60 by default) at once,
// sessions included. So the Conns that probe a server the same way (same
// address, same dialer) share one probe: a result younger than half the
// asking Conn's probe interval is reused, a probe under way is waited for,
// and the round trip reported is that probe's. One process then opens at
// most about 2 / interval probe connections per server (8 a second by
// default), however many Conns it runs.
var probes = struct {
	mu      sync.Mutex
	entries map[probeKey]*probeEntry
}{entries: map[probeKey]*probeEntry{}}

// probeKey names a way to probe a server: its address, and the dialer
// ("" for the default one; a Conn with a dialer of its own shares with
// nobody).
type probeKey struct {
	addr, dialer string
}

type probeEntry struct {
	refs int // Conns holding it, under probes.mu

	mu      sync.Mutex
	at      time.Time // when the last probe that ended began; zero if none counts
	res     router.ProbeResult
	err     error
	running chan struct{} // closed when the probe under way ends; nil if none
}

func acquireProbe(key probeKey) *probeEntry {
	probes.mu.Lock()
	defer probes.mu.Unlock()
	e := probes.entries[key]
	if e == nil {
		e = &probeEntry{}
		probes.entries[key] = e
	}
	e.refs++
	return e
}

func releaseProbe(key probeKey) {
	probes.mu.Lock()
	defer probes.mu.Unlock()
	if e := probes.entries[key]; e != nil {
		if e.refs--; e.refs == 0 {
			delete(probes.entries, key)
		}
	}
}

// get returns a result of probe no older than maxAge, probing if needed;
// concurrent callers share one probe.
func (e *probeEntry) get(ctx context.Context, maxAge time.Duration, probe func(context.Context) (router.ProbeResult, error)) (router.ProbeResult, error) {
	for {
		e.mu.Lock()
		if e.running == nil && !e.at.IsZero() && time.Since(e.at) < maxAge {
			res, err := e.res, e.err
			e.mu.Unlock()
			return res, err
		}
		if ch := e.running; ch != nil {
			e.mu.Unlock()
			select {
			case <-ch:
				continue // its result, or our own probe if it was cut short
			case <-ctx.Done():
				return router.ProbeResult{}, ctx.Err()
			}
		}
		ch := make(chan struct{})
		e.running = ch
		e.mu.Unlock()

		start := time.Now()
		res, err := probe(ctx)
		rtt := time.Since(start)
		if err == nil {
			res.RTT = rtt
		}
		e.mu.Lock()
		e.res, e.err, e.at = res, err, start
		if ctx.Err() != nil {
			// Cut short by the caller (its Conn closing, its own timeout):
			// no evidence for the others, who probe again.
			e.at = time.Time{}
		}
		e.running = nil
		close(ch)
		e.mu.Unlock()
		return res, err
	}
}

// probe asks a server for its role with the srvr four-letter command, over
// a connection of its own (four-letter commands are one per connection),
// shared with the process's other Conns (see probes). ruok would prove
// nothing: a server without quorum answers imok.
func (c *Conn) probe(ctx context.Context, m router.Member) (router.ProbeResult, error) {
	srv := c.servers()
	idx, ok := srv.byAddr[m.Addr]
	if !ok || srv.probes[idx] == nil {
		return router.ProbeResult{}, fmt.Errorf("oproute/zk: %s is no longer a server of the Conn", m.ID)
	}
	return srv.probes[idx].get(ctx, c.probeMaxAge, func(ctx context.Context) (router.ProbeResult, error) {
		return c.srvr(ctx, m.Addr)
	})
}

func (c *Conn) srvr(ctx context.Context, addr string) (router.ProbeResult, error) {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		timeout := time.Second
		if dl, ok := ctx.Deadline(); ok {
			timeout = time.Until(dl)
		}
		return c.o.dialer(network, addr, timeout)
	}
	b, err := zk4lw.Send(ctx, dial, addr, "srvr")
	if errors.Is(err, zk4lw.ErrNotServing) {
		return router.ProbeResult{NotServing: true}, nil
	}
	if err != nil {
		return router.ProbeResult{}, err
	}
	st, err := zk4lw.ParseSrvr(b)
	if err != nil {
		return router.ProbeResult{}, err
	}
	return probeResult(st), nil
}

// probeKey is the Conn's probe key for a server address.
func (c *Conn) probeKey(addr string) probeKey {
	dialer := c.o.dialerKey
	if dialer == "" && c.o.customDialer {
		dialer = fmt.Sprintf("conn %p", c)
	}
	return probeKey{addr, dialer}
}

// probeResult maps a server's srvr answer to what the router needs.
//
// A leader names itself with its epoch: its zxid carries the epoch from
// the moment it leads, so of two servers that both claim to lead (one was
// deposed while frozen and has not noticed) the one at the older epoch is
// told apart and leaves the read pool.
//
// Followers give no epoch: a follower's srvr zxid is the last transaction
// it applied, which stays in the old epoch after an election until the new
// leader's first write, with nothing wrong. Their zxid is their applied
// index instead, and the leader's is the committed index once the leader
// has committed in its epoch (low 32 bits > 0; before that, a caught-up
// follower's zxid is unknown). A follower more than Config.MaxLag
// transactions behind, or still in an older epoch after the leader's first
// commit (a difference of 2³² or more), leaves the read pool.
func probeResult(st zk4lw.Srvr) router.ProbeResult {
	zxid := uint64(st.Zxid)
	switch st.Mode {
	case "leader", "standalone":
		res := router.ProbeResult{IsLeader: true, Term: st.Epoch()}
		if zxid&0xffffffff > 0 {
			res.Committed = zxid
		}
		return res
	case "follower", "observer":
		return router.ProbeResult{Applied: zxid}
	default: // read-only and anything new: answers, but not a full member
		return router.ProbeResult{NotServing: true}
	}
}

func (c *Conn) releaseProbes() {
	srv := c.servers()
	for i, a := range srv.addrs {
		if !srv.retired[i] {
			releaseProbe(c.probeKey(a))
		}
	}
}

// answersProbes reports whether member idx, still a server of the Conn,
// answered its last probe (it may have said it does not serve).
func (c *Conn) answersProbes(idx int) bool {
	st := c.r.Stats()
	return idx < len(st.Members) && st.Members[idx].ProbeOK && !st.Members[idx].Retired
}
