package zk

import (
	"context"
	"fmt"
	"net"
	"slices"

	"github.com/oproute/oproute/internal/members"
	"github.com/oproute/oproute/router"
)

// hostPort validates a server and adds ZooKeeper's default port.
func hostPort(srv string) (string, error) {
	if srv == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidServer)
	}
	if _, _, err := net.SplitHostPort(srv); err != nil {
		if _, _, err2 := net.SplitHostPort(srv + ":2181"); err2 != nil {
			return "", fmt.Errorf("%w: %q: %w", ErrInvalidServer, srv, err)
		}
		return srv + ":2181", nil
	}
	return srv, nil
}

// rebalance runs after every probe round: sessions leave servers that no
// longer answer and follow their target (the primary the leader, member
// sessions their member).
func (c *Conn) rebalance() {
	if c.closed.Load() || !c.started.Load() {
		return
	}
	if !c.expired.Load() {
		c.primary.follow()
	}
	srv := c.servers()
	c.memMu.Lock()
	var gone []*session
	for i, s := range c.mem {
		if s != nil && i < len(srv.retired) && srv.retired[i] {
			gone = append(gone, s) // its server left the Conn
			c.mem[i] = nil
		}
	}
	mem := slices.Clone(c.mem)
	c.memMu.Unlock()
	for _, s := range gone {
		c.bg.Go(s.close)
	}
	for _, s := range mem {
		if s != nil {
			s.follow()
		}
	}
}

// SetServers changes the Conn's servers to servers (as given to Connect),
// for a server list that changed at run time. A server already known keeps
// its sessions and its health; a new one takes calls after its first good
// probe; a server left out gets no new calls: the calls in flight there
// finish, its session is closed and the primary session moves off it. It
// fails, changing nothing, on an empty list, a bad server or a duplicate.
func (c *Conn) SetServers(servers []string) error {
	if err := c.check(context.Background()); err != nil {
		return err
	}
	ms, _, err := members.Build(servers, hostPort, c.o.Zones)
	if err != nil {
		return err
	}
	c.srvMu.Lock()
	defer c.srvMu.Unlock()
	if err := c.r.SetMembers(ms); err != nil {
		return mapRouterErr(err)
	}
	// The router's members, by index, are the Conn's servers.
	old, st := c.servers(), c.r.Stats()
	srv := &serverList{byAddr: map[string]int{}}
	for i, m := range st.Members {
		addr := m.Member.Addr
		srv.members = append(srv.members, m.Member)
		srv.addrs = append(srv.addrs, addr)
		srv.retired = append(srv.retired, m.Retired)
		srv.byAddr[addr] = i
		known := i < len(old.probes) && old.probes[i] != nil
		var e *probeEntry
		switch {
		case m.Retired && known:
			releaseProbe(c.probeKey(addr))
		case m.Retired:
		case known:
			e = old.probes[i]
		default:
			e = acquireProbe(c.probeKey(addr))
		}
		srv.probes = append(srv.probes, e)
	}
	for i, m := range st.Members { // an address retired and added again: the live index
		if !m.Retired {
			srv.byAddr[m.Member.Addr] = i
		}
	}
	c.srv.Store(srv)
	c.memMu.Lock()
	for len(c.mem) < len(srv.addrs) {
		c.mem = append(c.mem, nil)
	}
	c.memMu.Unlock()
	c.r.Refresh()
	return nil
}

// sessionServers returns, per server index, how many of the Conn's
// sessions are connected there (for tests and diagnostics).
func (c *Conn) sessionServers() []int {
	n := make([]int, len(c.servers().members))
	if i := c.primary.cur.Load(); i >= 0 {
		n[i]++
	}
	c.memMu.Lock()
	defer c.memMu.Unlock()
	for _, s := range c.mem {
		if s != nil {
			if i := s.cur.Load(); i >= 0 {
				n[i]++
			}
		}
	}
	return n
}

// serverList is the Conn's servers, by index (the router's member index).
// Never changed in place: SetServers publishes a new one.
type serverList struct {
	members []router.Member
	addrs   []string
	byAddr  map[string]int
	retired []bool
	probes  []*probeEntry // nil for a retired server
}

func (c *Conn) servers() *serverList { return c.srv.Load() }

// active returns the indexes of the servers not retired.
func (l *serverList) active() []int {
	var out []int
	for i := range l.addrs {
		if !l.retired[i] {
			out = append(out, i)
		}
	}
	return out
}
