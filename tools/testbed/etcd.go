package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdOptions configures StartEtcd.
type EtcdOptions struct {
	// Topology places the members; its Zones set the cluster size.
	// Default is DefaultTopology(3).
	Topology Topology
	// Dir holds data and logs. Default is a new temporary directory,
	// removed by Close.
	Dir string
	// StartTimeout bounds start-up. Default is 90 s.
	StartTimeout time.Duration
	// ClientTLS serves clients over TLS with a certificate from a throw-away
	// CA; ClientTLS() returns a configuration that trusts it.
	ClientTLS bool
	// CPUBudgets confine members to a share of the CPU; the zero value
	// leaves them sharing the host's cores.
	CPUBudgets
	// Server runs the members as this etcd server binary (EtcdServer
	// builds one of another version) rather than as the test bed's own,
	// with their proxies apart (CPUBudgets.ProxiesApart). Empty: the
	// server/v3 the tools module requires.
	Server string
}

// EtcdCluster is a running test-bed etcd cluster.
type EtcdCluster struct {
	topo    Topology
	token   string
	http    *http.Client // for /metrics
	members []*EtcdMember

	cluster // network, fault knobs

	server string // EtcdOptions.Server

	mu     sync.Mutex
	admins map[int]*clientv3.Client
}

// EtcdMember is one member of an EtcdCluster.
type EtcdMember struct {
	Index int
	Name  string
	Zone  string

	server // its process: PID, pause, kill

	id   atomic.Uint64
	spec memberSpec
}

// StartEtcd starts a cluster and returns once every member serves and the
// topology's leader holds leadership.
func StartEtcd(ctx context.Context, opts EtcdOptions) (*EtcdCluster, error) {
	return retryPortTaken(func() (*EtcdCluster, error) { return startEtcd(ctx, opts) })
}

func startEtcd(ctx context.Context, opts EtcdOptions) (_ *EtcdCluster, err error) {
	if err := startDefaults(&opts.Topology, &opts.StartTimeout); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	if opts.Server != "" {
		opts.ProxiesApart = true // the server's process runs nothing of the test bed's
	}
	c := &EtcdCluster{topo: opts.Topology, token: fmt.Sprintf("oproute-%d", rand.Uint64()), admins: map[int]*clientv3.Client{}, server: opts.Server}
	track(c)
	c.net = &netState{Topo: opts.Topology, Extra: make([]linkExtra, len(opts.Topology.Zones)), IDs: map[string]int{}}
	c.cpu = memberLimits{budgets: opts.CPUBudgets, initial: len(opts.Topology.Zones), prefix: "oproute-" + c.token}
	c.apartHosts = opts.ProxiesApart
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := c.prepare(ctx, opts.Dir, "oproute-etcd-", opts.ClientTLS); err != nil {
		return nil, err
	}
	for i := range c.topo.Zones {
		if err := c.cpu.grow(i); err != nil {
			return nil, err
		}
	}
	c.http = &http.Client{Transport: &http.Transport{TLSClientConfig: c.ClientTLS()}, Timeout: 5 * time.Second}

	var initial []string
	// All ports at once: ports released between picks can be picked again.
	allPorts, err := freePorts(4 * len(c.topo.Zones))
	if err != nil {
		return nil, err
	}
	for i, zone := range c.topo.Zones {
		m := c.newMember(i, zone, allPorts[4*i:4*i+4], "new")
		c.members = append(c.members, m)
		c.nodes = append(c.nodes, &m.server)
		initial = append(initial, m.Name+"="+m.spec.AdvertisePeer)
	}
	for _, m := range c.members {
		m.spec.InitialCluster = strings.Join(initial, ",")
		if err := c.launch(m); err != nil {
			return nil, err
		}
	}
	for _, m := range c.members {
		if err := c.waitReady(ctx, m); err != nil {
			return nil, err
		}
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		return nil, err
	}
	if err := c.learnIDs(ctx); err != nil {
		return nil, err
	}
	if c.topo.Leader >= 0 {
		if err := c.MoveLeader(ctx, c.topo.Leader); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// newMember describes member i in zone: it listens on the first two of
// ports; its own proxies, which clients and peers are told about, on the
// other two. clusterState is etcd's --initial-cluster-state.
func (c *EtcdCluster) newMember(i int, zone string, ports []int, clusterState string) *EtcdMember {
	m := &EtcdMember{Index: i, Name: fmt.Sprintf("m%d", i), Zone: zone}
	m.server.name = m.Name
	scheme := "http"
	if c.tls != nil {
		scheme = "https"
	}
	m.spec = memberSpec{
		Index:           i,
		Name:            m.Name,
		Dir:             filepath.Join(c.dir, m.Name),
		ListenClient:    fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[0]),
		ListenPeer:      fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		AdvertiseClient: fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[2]),
		AdvertisePeer:   fmt.Sprintf("http://127.0.0.1:%d", ports[3]),
		ClusterState:    clusterState,
		Token:           c.token,
	}
	if c.tls != nil {
		m.spec.CertFile, m.spec.KeyFile = c.tls.cert, c.tls.key
	}
	return m
}

func (c *EtcdCluster) launch(m *EtcdMember) error {
	return c.withNet(func(net *netState) error {
		m.spec.Net = net
		m.spec.ProxiesApart = c.cpu.budgets.ProxiesApart
		spec, _ := json.Marshal(m.spec)
		if m.spec.ProxiesApart && !m.control().running() {
			// A host of their own, started once: it outlives kills.
			if _, err := c.startProxyHost(&m.server, m.Index, etcdProxiesEnv, spec, c.proxyLogPath(m)); err != nil {
				return err
			}
		}
		cmd := exec.Command(c.bin)
		cmd.Env = c.cpu.goEnv(m.Index, append(os.Environ(), memberEnv+"="+string(spec)))
		if c.server != "" {
			cmd = exec.Command(c.server, serverFlags(m.spec)...)
			cmd.Env = c.cpu.goEnv(m.Index, serverEnv())
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		p, err := startChild(cmd, c.logPath(m))
		if err != nil {
			return fmt.Errorf("testbed: start %s: %w", m.Name, err)
		}
		if err := c.cpu.confine(m.Index, cmd.Process.Pid); err != nil {
			p.stop()
			return err
		}
		m.started(p)
		if c.server != "" {
			awaitServerHealth(p, c.http, m.spec.ListenClient)
		}
		if !m.spec.ProxiesApart {
			m.controlledBy(p) // the member hosts its own proxies: one process for both
		}
		return nil
	})
}

func (c *EtcdCluster) logPath(m *EtcdMember) string { return filepath.Join(c.dir, m.Name+".log") }

func (c *EtcdCluster) proxyLogPath(m *EtcdMember) string {
	return filepath.Join(c.dir, m.Name+"-proxies.log")
}

func (c *EtcdCluster) waitReady(ctx context.Context, m *EtcdMember) error {
	p, host := m.process(), m.control()
	if p == nil {
		return fmt.Errorf("%w: %s", ErrNotRunning, m.Name)
	}
	if host != p {
		if err := awaitReady(ctx, host, m.Name+" proxies", c.proxyLogPath(m)); err != nil {
			return err
		}
	}
	return awaitReady(ctx, p, m.Name, c.logPath(m))
}

// Size returns the number of members.
func (c *EtcdCluster) Size() int { return len(c.members) }

// Topology returns the cluster's topology.
func (c *EtcdCluster) Topology() Topology { return c.topo }

// Member returns member i.
func (c *EtcdCluster) Member(i int) *EtcdMember { return c.members[i] }

// Endpoints returns the members' client URLs as clients see them, through
// the shaping proxies.
func (c *EtcdCluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.spec.AdvertiseClient
	}
	return eps
}

// DirectEndpoints returns the members' unshaped client URLs, for control.
func (c *EtcdCluster) DirectEndpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.spec.ListenClient
	}
	return eps
}

// ID returns the member's etcd member ID.
func (m *EtcdMember) ID() uint64 { return m.id.Load() }

// Endpoint returns the member's shaped client URL.
func (m *EtcdMember) Endpoint() string { return m.spec.AdvertiseClient }

// Kill crashes member i (SIGKILL, no leadership hand-over) and waits for
// its process to end.
func (c *EtcdCluster) Kill(i int) error {
	if err := c.cluster.Kill(i); err != nil {
		return err
	}
	c.dropAdmin(i)
	return nil
}

// Restart starts a killed member again on its data and waits until it serves.
func (c *EtcdCluster) Restart(ctx context.Context, i int) error {
	m := c.members[i]
	if err := m.restartable(); err != nil {
		return err
	}
	m.spec.ClusterState = "existing"
	if err := c.launch(m); err != nil {
		return err
	}
	return c.waitReady(ctx, m)
}

// Close stops every member (SIGKILL: their data is thrown away), the
// proxies and the control clients, and removes the directory it created.
func (c *EtcdCluster) Close() error {
	if !c.beginClose() {
		return nil
	}
	untrack(c)
	c.mu.Lock() // after beginClose: admin() adds no client once this holds
	admins := c.admins
	c.admins = nil
	c.mu.Unlock()
	for _, cli := range admins {
		cli.Close()
	}
	if c.http != nil {
		c.http.CloseIdleConnections()
	}
	return c.closeNodes()
}

// Zones returns each member's zone.
func (c *EtcdCluster) Zones() []string { return slices.Clone(c.topo.Zones) }
