package testbed

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// AddMember grows the cluster by a member in zone, as an operator does:
// MemberAdd on the leader with the new member's peer URL, then the new
// member started on an empty data directory with --initial-cluster-state
// existing. It returns the new member's index once it serves. Indexes
// never move: a removed member keeps its own. Not to be called
// concurrently with other calls on the cluster.
func (c *EtcdCluster) AddMember(ctx context.Context, zone string) (int, error) {
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		return -1, err
	}
	ports, err := freePorts(4)
	if err != nil {
		return -1, err
	}
	i := len(c.members)
	m := c.newMember(i, zone, ports, "existing")
	cli, err := c.admin(leader)
	if err != nil {
		return -1, err
	}
	var resp *clientv3.MemberAddResponse
	err = whenHealthy(ctx, func(ctx context.Context) (err error) {
		resp, err = cli.MemberAdd(ctx, []string{m.spec.AdvertisePeer})
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("testbed: add %s: %w", m.Name, err)
	}
	m.id.Store(resp.Member.ID)
	var initial []string
	for _, pm := range resp.Members {
		name := pm.Name
		if pm.ID == resp.Member.ID {
			name = m.Name
		}
		for _, u := range pm.PeerURLs {
			initial = append(initial, name+"="+u)
		}
	}
	m.spec.InitialCluster = strings.Join(initial, ",")
	if err := c.cpu.grow(i); err != nil {
		return -1, err
	}
	c.members = append(c.members, m)
	c.topo.Zones = append(c.topo.Zones, zone)
	c.grow(&m.server, i, zone, strconv.FormatUint(resp.Member.ID, 16))
	if err := c.launch(m); err != nil {
		return -1, err
	}
	if err := c.waitReady(ctx, m); err != nil {
		return -1, err
	}
	return i, nil
}

// RemoveMember shrinks the cluster by member i, as an operator does:
// MemberRemove asked of another member (the leader when i is not it),
// after which etcd stops the removed member's server and its process ends
// (killed if it has not within 10 s). Its index stays, not running. Not to
// be called concurrently with other calls on the cluster.
func (c *EtcdCluster) RemoveMember(ctx context.Context, i int) error {
	m := c.members[i]
	if m.removed.Load() {
		return fmt.Errorf("%w: %s was removed", ErrNotRunning, m.Name)
	}
	ask := -1
	if l, err := c.WaitLeader(ctx); err == nil && l != i {
		ask = l
	}
	for j, o := range c.members {
		if ask < 0 && j != i && !o.removed.Load() && o.PID() != 0 {
			ask = j
		}
	}
	if ask < 0 {
		return fmt.Errorf("%w: no other member to ask", ErrNotRunning)
	}
	cli, err := c.admin(ask)
	if err != nil {
		return err
	}
	err = whenHealthy(ctx, func(ctx context.Context) error {
		_, err := cli.MemberRemove(ctx, m.ID())
		return err
	})
	if err != nil {
		return fmt.Errorf("testbed: remove %s: %w", m.Name, err)
	}
	m.removed.Store(true)
	c.dropAdmin(i)
	deadline := time.Now().Add(10 * time.Second)
	for m.PID() != 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond) // waiting for a process to end
	}
	if m.PID() != 0 {
		if err := m.kill(); err != nil && m.PID() != 0 {
			return err
		}
	}
	return nil
}

// whenHealthy runs a membership change, again while etcd refuses it for
// now (its leader wants every member connected for 5 s before a change,
// and enough started members to keep a quorum), for up to 20 s.
func whenHealthy(ctx context.Context, change func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		err := change(cctx)
		ccancel()
		if !errors.Is(err, rpctypes.ErrUnhealthy) && !errors.Is(err, rpctypes.ErrMemberNotEnoughStarted) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Removed reports whether member i was removed from the cluster.
func (m *EtcdMember) Removed() bool { return m.removed.Load() }
