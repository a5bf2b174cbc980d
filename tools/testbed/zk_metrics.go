package testbed

import (
	"context"

	"github.com/oproute/oproute/internal/zk4lw"
)

// Requests returns what server i's own sessions have asked of it so far
// (mntr: updates, and reads including syncs).
func (c *ZKCluster) Requests(ctx context.Context, i int) (zk4lw.Requests, error) {
	m, err := c.Mntr(ctx, i)
	if err != nil {
		return zk4lw.Requests{}, err
	}
	return zk4lw.ParseRequests(m), nil
}

// Served returns what server i's own sessions asked of it (mntr: updates
// as writes, reads including syncs). A server that is not running counts
// zero.
func (c *ZKCluster) Served(ctx context.Context, i int) (Served, error) {
	return servedBy(&c.servers[i].server, func() (Served, error) {
		n, err := c.Requests(ctx, i)
		return Served{Writes: n.Updates, Reads: n.Reads}, err
	})
}

// ClientConnections returns how many client connections server i's proxy
// has accepted.
func (c *ZKCluster) ClientConnections(i int) uint64 { return c.servers[i].clientConnections() }
