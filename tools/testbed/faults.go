package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Faults is what a test can do to the members of either cluster type; the
// conformance suite and routebench take it rather than listing the knobs.
type Faults interface {
	Degrade(i int, delay, jitter time.Duration)
	DegradePeers(i int, delay, jitter time.Duration)
	Partition(i int, on bool)
	ResetClients(i int, on bool)
	Blackhole(i int, on bool)
	Pause(i int) error
	Resume(i int) error
	Kill(i int) error
	Restart(ctx context.Context, i int) error
	MoveLeader(ctx context.Context, to int) error
	// Heal undoes every fault above, so that tests can share a cluster.
	Heal(ctx context.Context) error
	// Zones returns each member's zone, in member order.
	Zones() []string
}

// cluster is embedded in EtcdCluster and ZKCluster: the emulated network,
// which every member's proxies shape by, the fault knobs, and what the two
// share of their lifetime (the directory, Close).
type cluster struct {
	netMu   sync.Mutex // serialises changes of net and their broadcast
	net     *netState
	nodes   []*server  // the members' processes, in member order
	nodesMu sync.Mutex // guards nodes' growth for readers that must not wait behind a broadcast (CPUTimes)

	dir     string    // data, configs and logs
	ownDir  bool      // made by the testbed: Close removes it
	bin     string    // the member binary (etcd members, ZooKeeper's proxies)
	tls     *tlsFiles // nil without ClientTLS
	cpu     memberLimits
	closing atomic.Bool
	// apartHosts: each member's proxies run in a process of their own
	// (startProxyHost), not in its server's.
	apartHosts bool
}

// prepare makes the work directory (dir, or a new one named by prefix), the
// member binary and, with clientTLS, the certificates. A cluster whose
// prepare failed is closed by its caller like any other.
func (c *cluster) prepare(ctx context.Context, dir, prefix string, clientTLS bool) (err error) {
	if c.dir, c.ownDir, err = workDir(dir, prefix); err != nil {
		return err
	}
	if c.bin, err = memberBinary(ctx, c.dir); err != nil {
		return err
	}
	if clientTLS {
		c.tls, err = makeTLS(c.dir)
	}
	return err
}

// MemberCPU returns the cores member i is confined to, 0 when unconfined.
func (c *cluster) MemberCPU(i int) float64 { return c.cpu.cores(i) }

// beginClose reports whether this is the cluster's first Close.
func (c *cluster) beginClose() bool { return c.closing.CompareAndSwap(false, true) }

// closeNodes stops every member's processes and removes the directory the
// testbed made.
func (c *cluster) closeNodes() error {
	for _, s := range c.nodes {
		s.close()
	}
	cerr := c.cpu.remove()
	if c.ownDir {
		return errors.Join(os.RemoveAll(c.dir), cerr)
	}
	return cerr
}

// setNet changes the network state and sends it to every member's proxies
// at once, returning once each has applied it: a change reaches the members
// together, as a network change would, and costs one control round trip,
// not one per member. A member frozen by Pause is not waited for: it
// applies the change when it thaws.
func (c *cluster) setNet(change func(*netState)) {
	c.netMu.Lock()
	defer c.netMu.Unlock()
	next := c.net.clone()
	change(next)
	c.net = next
	var wg sync.WaitGroup
	for _, s := range c.nodes {
		wg.Go(func() { s.ask(control{Net: next}, 5*time.Second) })
	}
	wg.Wait()
}

// grow adds member i's process (not yet started) to the cluster, in zone,
// with its peer links known by id (the key peerLink looks senders up by),
// and tells the running members' proxies.
func (c *cluster) grow(node *server, i int, zone, id string) {
	c.netMu.Lock()
	c.nodesMu.Lock()
	c.nodes = append(c.nodes, node)
	c.nodesMu.Unlock()
	c.netMu.Unlock()
	c.setNet(func(n *netState) {
		n.Topo.Zones = append(n.Topo.Zones, zone)
		n.Extra = append(n.Extra, linkExtra{})
		n.IDs[id] = i
	})
}

// withNet calls start with a copy of the network state and holds changes
// back until it returns, so that a proxy host it starts and records (with
// controlledBy) sees every later change.
func (c *cluster) withNet(start func(*netState) error) error {
	c.netMu.Lock()
	defer c.netMu.Unlock()
	return start(c.net.clone())
}

// Degrade adds delay and jitter to every link of member i, both ways:
// client and peer links, as netem on the member's host would. Zero removes
// it.
func (c *cluster) Degrade(i int, delay, jitter time.Duration) {
	c.setNet(func(n *netState) { n.Extra[i].Delay, n.Extra[i].Jitter = delay, jitter })
}

// DegradePeers adds delay and jitter to member i's peer links only, both
// ways, as a congested or distant link between the servers would, while
// clients reach member i as fast as before. Zero removes it.
func (c *cluster) DegradePeers(i int, delay, jitter time.Duration) {
	c.setNet(func(n *netState) { n.Extra[i].PeerDelay, n.Extra[i].PeerJitter = delay, jitter })
}

// Blackhole drops every byte on member i's links while on.
func (c *cluster) Blackhole(i int, on bool) {
	c.setNet(func(n *netState) { n.Extra[i].Blackhole = on })
}

// BlackholeClients drops every byte on every client link while on (peer
// links keep working): the client is cut off from the whole cluster.
func (c *cluster) BlackholeClients(on bool) {
	c.setNet(func(n *netState) { n.ClientsCut = on })
}

// Partition cuts member i off from its peers while on, as a network
// partition between the servers that the client's network escapes: every
// peer link into and out of member i stalls (connections stay open; bytes
// are held, with TCP backpressure, and delivered when the partition heals,
// as TCP retransmission delivers them), while its client link stays up and
// shaped as before. A partitioned etcd follower loses its leader and serves
// only serializable reads; a partitioned ZooKeeper follower hangs its syncs
// and stops serving after syncLimit ticks. Peer links are told apart by
// their sender, which etcd names in the raft requests (streams, pipeline,
// snapshots); the few peer requests that name no sender (a follower
// forwarding lease renewals to the leader, the leader's /version polls)
// stall into member i but pass from member i to a healthy one.
func (c *cluster) Partition(i int, on bool) {
	c.setNet(func(n *netState) { n.Extra[i].Partitioned = on })
}

// ResetClients makes member i's client link fail fast while on, as a host
// whose firewall rejects the client port: client connections through its
// client proxy are reset (TCP RST) at once, idle ones included, and new
// ones are accepted and reset straight away, while its peer links keep
// working. The direct endpoints are spared.
func (c *cluster) ResetClients(i int, on bool) {
	c.setNet(func(n *netState) { n.Extra[i].ResetClients = on })
}

// ResetClientsAfterReply makes member i's client link reset each new
// connection right after the member's first answer reaches the client (for
// ZooKeeper, the handshake's), while on: a reset that lands between a
// reconnect's handshake and the client's next request.
func (c *cluster) ResetClientsAfterReply(i int, on bool) {
	c.setNet(func(n *netState) { n.Extra[i].ResetClientsAfterReply = on })
}

// Pause freezes member i's server process (SIGSTOP) and returns once every
// thread of it has stopped: its TCP connections stay open and its kernel
// still accepts new ones; nothing answers. An etcd
// member's proxies run in its process and freeze with it (unless
// CPUBudgets.ProxiesApart); a ZooKeeper server's run apart and keep
// accepting.
func (c *cluster) Pause(i int) error { return c.nodes[i].pause() }

// Resume continues a paused member (SIGCONT).
func (c *cluster) Resume(i int) error { return c.nodes[i].resume() }

// Kill crashes member i's server process (SIGKILL: no leadership
// hand-over) and waits for it to end.
func (c *cluster) Kill(i int) error { return c.nodes[i].kill() }

// heal undoes every fault: the network as the topology gives it (no extra
// delay, partition, blackhole, reset or cut), paused members resumed,
// killed ones started again (restart), and leadership on the topology's
// leader (moveLeader), if it names one, until settled (which waits until
// every member follows one leader) returns it: moved again after an
// election nobody asked for. Removed members stay removed.
func (c *cluster) heal(ctx context.Context, leader int, restart, moveLeader func(context.Context, int) error, settled func(context.Context) (int, error)) error {
	c.setNet(func(n *netState) {
		clear(n.Extra)
		n.ClientsCut = false
	})
	c.netMu.Lock()
	nodes := slices.Clone(c.nodes)
	c.netMu.Unlock()
	for i, s := range nodes {
		if s.removed.Load() {
			continue
		}
		if s.paused() {
			if err := s.resume(); err != nil {
				return err
			}
		}
		if s.PID() == 0 {
			if err := restart(ctx, i); err != nil {
				return err
			}
		}
	}
	for {
		now, err := settled(ctx)
		if err != nil || leader < 0 || now == leader {
			return err
		}
		if err := moveLeader(ctx, leader); err != nil {
			return err
		}
	}
}

// moveLeader hands leadership on until member to holds it, for both
// backends: handOver moves it away from the current leader (etcd asks the
// leader to transfer it; ZooKeeper, which cannot, restarts the leader). A
// hand-over that leaves the leader in place (a refused transfer) is retried
// while ctx lasts; one that elects another member than to counts, and
// after 2×size of those moveLeader gives up (ZooKeeper elects by zxid, then
// by myid, so a server may never win).
func moveLeader(ctx context.Context, size, to int, target string, waitLeader func(context.Context) (int, error), handOver func(ctx context.Context, from int) error) error {
	prev, missed := -1, 0
	var elected []int // the leaders seen, for the error
	for {
		cur, err := waitLeader(ctx)
		if err != nil {
			return err
		}
		if cur == to {
			return nil
		}
		elected = append(elected, cur)
		if prev >= 0 && cur != prev {
			if missed++; missed >= 2*size {
				return fmt.Errorf("testbed: %s did not win an election (leaders by index, in turn: %v): %w: %w", target, elected, ErrNoLeader, errLeaderNotMoved)
			}
		}
		if err := handOver(ctx, cur); err != nil {
			return err
		}
		prev = cur
	}
}
