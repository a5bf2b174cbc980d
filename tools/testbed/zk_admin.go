package testbed

import (
	"context"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/internal/zk4lw"
)

// withClient runs fn with a plain client session on server i's own port.
func (c *ZKCluster) withClient(ctx context.Context, i int, fn func(*zk.Conn) error) error {
	conn, events, err := zk.Connect([]string{addr(c.servers[i].clientPort)}, 10*time.Second, zk.WithLogger(testutil.Discard{}))
	if err != nil {
		return fmt.Errorf("testbed: client of %s: %w", c.servers[i].Name, err)
	}
	defer conn.Close()
	timeout := time.After(10 * time.Second)
	for conn.State() != zk.StateHasSession {
		select {
		case <-events:
		case <-ctx.Done():
			return fmt.Errorf("testbed: %s: no session: %w", c.servers[i].Name, ctx.Err())
		case <-timeout:
			return fmt.Errorf("testbed: %s: no session: %w", c.servers[i].Name, zk.ErrNoServer)
		}
	}
	if err := fn(conn); err != nil {
		return fmt.Errorf("testbed: %s: %w", c.servers[i].Name, err)
	}
	return nil
}

// FourLetter sends a four-letter command to server i directly (not through
// its proxy) and returns the answer.
func (c *ZKCluster) FourLetter(ctx context.Context, i int, cmd string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	b, err := zk4lw.Send(ctx, nil, addr(c.servers[i].clientPort), cmd)
	if err != nil {
		return b, fmt.Errorf("z%d: %w", i, err)
	}
	return b, nil
}

// ErrFourLetterWordRefused: a server refused a four-letter word its
// 4lw.commands.whitelist leaves out (ZKOptions.FourLetterWords): Mntr
// without mntr, say.
var ErrFourLetterWordRefused = zk4lw.ErrNotAllowed

// Srvr returns server i's srvr answer.
func (c *ZKCluster) Srvr(ctx context.Context, i int) (zk4lw.Srvr, error) {
	b, err := c.FourLetter(ctx, i, "srvr")
	if err != nil {
		return zk4lw.Srvr{}, err
	}
	return zk4lw.ParseSrvr(b)
}

// Mntr returns server i's mntr answer as key → value.
func (c *ZKCluster) Mntr(ctx context.Context, i int) (map[string]string, error) {
	b, err := c.FourLetter(ctx, i, "mntr")
	if err != nil {
		return nil, err
	}
	return zk4lw.ParseMntr(b), nil
}

// Leader returns the index of the server whose srvr says "Mode: leader";
// ErrNoLeader when none does.
func (c *ZKCluster) Leader(ctx context.Context) (int, error) {
	for i, s := range c.servers {
		if s.PID() == 0 || s.paused() {
			continue
		}
		if st, err := c.Srvr(ctx, i); err == nil && st.Mode == "leader" {
			return i, nil
		}
	}
	return -1, ErrNoLeader
}

// WaitLeader polls until a server leads and every other running server
// serves, and returns the leader.
func (c *ZKCluster) WaitLeader(ctx context.Context) (int, error) {
	for {
		l, err := c.Leader(ctx)
		if err == nil {
			serving := true
			for i, s := range c.servers {
				if i == l || s.PID() == 0 || s.paused() {
					continue
				}
				if st, err := c.Srvr(ctx, i); err != nil || st.Mode != "follower" {
					serving = false
				}
			}
			if serving {
				return l, nil
			}
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("testbed: waiting for a ZooKeeper leader: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Heal undoes every fault (see Faults) and returns once a server leads
// (the topology's, if it names one, moved there again after an election
// nobody asked for) and every other running server follows.
func (c *ZKCluster) Heal(ctx context.Context) error {
	return c.heal(ctx, c.topo.Leader, c.Restart, c.MoveLeader, c.WaitLeader)
}

// MoveLeader makes server to the leader. ZooKeeper 3.8 has no leadership
// transfer, so this restarts the leader until to wins an election (it
// prefers the highest zxid, then the highest myid). It gives up after a
// few elections.
func (c *ZKCluster) MoveLeader(ctx context.Context, to int) error {
	return moveLeader(ctx, len(c.servers), to, c.servers[to].Name, c.WaitLeader, func(ctx context.Context, from int) error {
		if err := c.Kill(from); err != nil {
			return err
		}
		if _, err := c.WaitLeader(ctx); err != nil {
			return err
		}
		return c.Restart(ctx, from)
	})
}
