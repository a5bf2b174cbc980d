package testbed

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"go.uber.org/zap"
)

// admin returns a control client for member i on its direct URL.
func (c *EtcdCluster) admin(i int) (*clientv3.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing.Load() {
		return nil, errors.New("testbed: cluster closed")
	}
	if cli := c.admins[i]; cli != nil {
		return cli, nil
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{c.members[i].spec.ListenClient},
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
		TLS:         c.ClientTLS(),
	})
	if err != nil {
		return nil, fmt.Errorf("testbed: admin client for m%d: %w", i, err)
	}
	c.admins[i] = cli
	return cli, nil
}

// Status returns member i's status, asked on its direct URL.
func (c *EtcdCluster) Status(ctx context.Context, i int) (*pb.StatusResponse, error) {
	cli, err := c.admin(i)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("testbed: status of m%d: %w", i, err)
	}
	return resp, nil
}

// Leader returns the index of the member that a majority of the running
// members names as leader at the highest term they report.
func (c *EtcdCluster) Leader(ctx context.Context) (int, error) {
	sts := make([]*pb.StatusResponse, len(c.members))
	for i := range c.members {
		if c.members[i].PID() == 0 {
			continue
		}
		if st, err := c.Status(ctx, i); err == nil {
			sts[i] = st
		}
	}
	leader, ok := MajorityLeader(sts, c.voters())
	if !ok {
		return -1, ErrNoLeader
	}
	for i, m := range c.members {
		if m.ID() == leader {
			if m.PID() == 0 {
				// The survivors have not noticed yet that it died.
				return -1, ErrNoLeader
			}
			return i, nil
		}
	}
	// IDs not learnt yet (start-up): ask each member who it is.
	for i := range c.members {
		if st, err := c.Status(ctx, i); err == nil && st.Header.MemberId == leader {
			return i, nil
		}
	}
	return -1, ErrNoLeader
}

// MajorityLeader returns the member ID that more than half of voters name
// as leader in sts (one Status answer per member, nil where none came),
// the highest term deciding between names given as often: the one rule
// for telling an etcd cluster's leader from its members' own answers.
func MajorityLeader(sts []*pb.StatusResponse, voters int) (uint64, bool) {
	type vote struct {
		leader uint64
		term   uint64
	}
	votes := map[vote]int{}
	for _, st := range sts {
		if st != nil && st.Leader != 0 {
			votes[vote{st.Leader, st.RaftTerm}]++
		}
	}
	best, n := vote{}, 0
	for v, k := range votes {
		if k > n || (k == n && v.term > best.term) {
			best, n = v, k
		}
	}
	return best.leader, n > voters/2
}

// voters returns how many members the cluster has, removed ones aside.
func (c *EtcdCluster) voters() int {
	n := 0
	for _, m := range c.members {
		if !m.removed.Load() {
			n++
		}
	}
	return n
}

// WaitLeader polls until a leader exists or ctx ends.
func (c *EtcdCluster) WaitLeader(ctx context.Context) (int, error) {
	for {
		i, err := c.Leader(ctx)
		if err == nil {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("testbed: waiting for a leader: %w", errors.Join(err, ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (c *EtcdCluster) learnIDs(ctx context.Context) error {
	idx := map[string]int{}
	for i, m := range c.members {
		st, err := c.Status(ctx, i)
		if err != nil {
			return err
		}
		m.id.Store(st.Header.MemberId)
		idx[strconv.FormatUint(st.Header.MemberId, 16)] = i
	}
	c.setNet(func(n *netState) { n.IDs = idx })
	return nil
}

// MoveLeader hands leadership to member to, asking the current leader (the
// only member that accepts MoveLeader), and waits until it holds.
func (c *EtcdCluster) MoveLeader(ctx context.Context, to int) error {
	return moveLeader(ctx, len(c.members), to, c.members[to].Name, c.WaitLeader, func(ctx context.Context, from int) error {
		cli, err := c.admin(from)
		if err != nil {
			return err
		}
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = cli.MoveLeader(mctx, c.members[to].ID())
		cancel()
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("testbed: move leader to m%d: %w", to, err)
		}
		return nil // refused: moveLeader asks again
	})
}

// Heal undoes every fault (see Faults) and returns once every member that
// is not removed answers Status naming the same leader: the topology's, if
// it names one (moved there again after an election nobody asked for).
func (c *EtcdCluster) Heal(ctx context.Context) error {
	return c.heal(ctx, c.topo.Leader, c.Restart, c.MoveLeader, c.waitAgreed)
}

// waitAgreed polls agreed until it holds or ctx ends.
func (c *EtcdCluster) waitAgreed(ctx context.Context) (int, error) {
	for {
		leader, err := c.agreed(ctx)
		if err == nil {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("testbed: heal: %w", errors.Join(err, ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// agreed returns the leader that a majority names, and fails unless
// every member that is not removed names it.
func (c *EtcdCluster) agreed(ctx context.Context) (int, error) {
	leader, err := c.Leader(ctx)
	if err != nil {
		return -1, err
	}
	want := c.members[leader].ID()
	for i, m := range c.members {
		if m.removed.Load() {
			continue
		}
		st, err := c.Status(ctx, i)
		if err != nil {
			return -1, err
		}
		if st.Leader != want {
			return -1, fmt.Errorf("testbed: m%d follows %x, the others m%d", i, st.Leader, leader)
		}
	}
	return leader, nil
}

func (c *EtcdCluster) dropAdmin(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cli := c.admins[i]; cli != nil {
		cli.Close()
		delete(c.admins, i)
	}
}
