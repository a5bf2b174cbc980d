package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ZooKeeperClassPath is where Debian's zookeeper package puts the server
// (its manifest names the other jars it needs) and the logging it runs with.
const ZooKeeperClassPath = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"

// ClassPathEnv names the environment variable that points the test bed at
// another ZooKeeper install: a Java class path (jars separated by ':') that
// holds QuorumPeerMain, its dependencies (Netty too, for ClientTLS) and an
// slf4j binding to log4j 1.2. ZKOptions.ClassPath overrides it.
const ClassPathEnv = "OPROUTE_ZK_CLASSPATH"

// ZooKeeperNettyClassPath is what a server with TLS (NettyServerCnxnFactory)
// needs besides the Netty jars zookeeper.jar's manifest names: Debian's
// libnetty-java, a dependency of its zookeeper package, has them.
const ZooKeeperNettyClassPath = "/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar:" +
	"/usr/share/java/netty-transport-native-unix-common.jar"

// ErrNoZooKeeper: the ZooKeeper server jars are not installed.
var ErrNoZooKeeper = errors.New("testbed: ZooKeeper not installed (apt-get install -y --no-install-recommends zookeeper, or point " + ClassPathEnv + " at an install)")

// ZKOptions configures StartZK.
type ZKOptions struct {
	// Topology gives the ensemble size, zones and delays. Default
	// DefaultTopology(3).
	Topology Topology
	// Dir holds the servers' data, configs and logs. Default: a temporary
	// directory removed by Close.
	Dir string
	// StartTimeout bounds start-up. Default 90 s.
	StartTimeout time.Duration
	// TickTime is ZooKeeper's tick: sessions time out after 2 to 20
	// ticks, a frozen leader is replaced after syncLimit (5) ticks.
	// Default 2 s, ZooKeeper's own.
	TickTime time.Duration
	// HeapMB is each JVM's maximum heap. Default 192.
	HeapMB int
	// MaxClientCnxns is ZooKeeper's maxClientCnxns: how many connections
	// one client address may hold to a server at once (every client of the
	// test bed, through its proxies, is 127.0.0.1). Default 0, unlimited;
	// ZooKeeper's own default is 60.
	MaxClientCnxns int
	// ClassPath overrides $OPROUTE_ZK_CLASSPATH (ClassPathEnv), which
	// overrides ZooKeeperClassPath (and, with ClientTLS,
	// ZooKeeperNettyClassPath).
	ClassPath string
	// ClientTLS serves clients over TLS (secureClientPort, Netty, PEM stores
	// from a throw-away CA; servers ask for a client certificate, as
	// ZooKeeper does by default): Endpoints lead to the secure port, and
	// ClientTLS() returns a configuration that trusts the CA and presents a
	// client certificate. The plain client port stays, for the test bed's own
	// four-letter commands (DirectEndpoints).
	ClientTLS bool
	// CPUBudgets confine each server (its JVM and, unless ProxiesApart,
	// its proxies) to a share of the CPU; the zero value leaves them
	// sharing the host's cores.
	CPUBudgets
	// Reconfig runs the ensemble with dynamic reconfiguration
	// (reconfigEnabled, skipACL so that any client may reconfigure), for
	// AddServer and RemoveServer. A reconfiguration gives every server the
	// same view of the others' addresses, so this ensemble has no delay
	// proxies: clients and peers reach the servers' own ports, the
	// ensemble's configuration (/zookeeper/config) names the client ports
	// that Endpoints returns, and the network faults do nothing.
	Reconfig bool
	// ExtendedTypes lets clients create TTL znodes
	// (zookeeper.extendedTypesEnabled).
	ExtendedTypes bool
	// ContainerCheck is how often the servers delete empty containers and
	// expired TTL znodes (znode.container.checkIntervalMs). Default
	// ZooKeeper's, a minute.
	ContainerCheck time.Duration
	// FourLetterWords is the servers' 4lw.commands.whitelist. Default
	// DefaultFourLetterWords. ZooKeeper answers srvr whatever it says;
	// Mntr, Requests and Served need mntr.
	FourLetterWords []string
}

// DefaultFourLetterWords are the four-letter words the test bed's servers
// allow: the router's probe (srvr) and what the test bed reads.
var DefaultFourLetterWords = []string{"srvr", "stat", "ruok", "mntr", "conf", "cons"}

// ZKCluster is a ZooKeeper ensemble of real QuorumPeerMain JVMs on
// 127.0.0.1. Every client link and every peer link (quorum and election)
// goes through a delay proxy: each server's proxies run in a process of
// their own, and each server's config names, for every other server, the
// proxy of that one link, so each pair of servers gets its own delay.
type ZKCluster struct {
	topo Topology
	opts ZKOptions

	cluster // network, fault knobs

	servers []*ZKServer
}

// ZKServer is one server of a ZKCluster.
type ZKServer struct {
	Index int
	Name  string
	Zone  string
	// SID is the server's myid. Member 0 has the highest, so that it wins
	// the first election (ZooKeeper prefers the highest id among equals).
	SID int

	server // the JVM (PID, pause, kill) and its proxies' host

	clientPort, quorumPort, electionPort int // the JVM's own
	securePort                           int // the JVM's TLS client port (ClientTLS)
	proxyClientPort                      int
	proxySpec                            zkProxySpec
}

// StartZK starts an ensemble and returns once every server serves and the
// topology's leader leads.
func StartZK(ctx context.Context, opts ZKOptions) (*ZKCluster, error) {
	// ZooKeeper elects by zxid, then myid: a fresh ensemble whose leader
	// would not move (a server that kept losing) is started afresh.
	return retryStart(func() (*ZKCluster, error) { return startZK(ctx, opts) }, func(err error) bool {
		return errors.Is(err, errPortTaken) || errors.Is(err, errLeaderNotMoved)
	})
}

func startZK(ctx context.Context, opts ZKOptions) (_ *ZKCluster, err error) {
	if err := startDefaults(&opts.Topology, &opts.StartTimeout); err != nil {
		return nil, err
	}
	if opts.TickTime == 0 {
		opts.TickTime = 2 * time.Second
	}
	if opts.FourLetterWords == nil {
		opts.FourLetterWords = slices.Clone(DefaultFourLetterWords)
	}
	if opts.HeapMB == 0 {
		opts.HeapMB = 192
	}
	if opts.ClassPath == "" {
		opts.ClassPath = os.Getenv(ClassPathEnv)
	}
	if opts.ClassPath == "" {
		opts.ClassPath = ZooKeeperClassPath
		if opts.ClientTLS {
			opts.ClassPath += ":" + ZooKeeperNettyClassPath
		}
	}
	for _, jar := range strings.Split(opts.ClassPath, ":") {
		if _, err := os.Stat(jar); err != nil {
			return nil, fmt.Errorf("%w: %s", ErrNoZooKeeper, jar)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	n := len(opts.Topology.Zones)
	c := &ZKCluster{topo: opts.Topology, opts: opts}
	track(c)
	ids := map[string]int{}
	for i := range n {
		ids[strconv.Itoa(i)] = i
	}
	c.net = &netState{Topo: opts.Topology, Extra: make([]linkExtra, n), IDs: ids}
	defer func() {
		if err != nil {
			if len(c.servers) > 0 {
				err = fmt.Errorf("%w\n%s", err, c.serverErrors()) // the servers' side, before Close removes their logs
			}
			c.Close()
		}
	}()
	if err := c.prepare(ctx, opts.Dir, "oproute-zk-", opts.ClientTLS); err != nil {
		return nil, err
	}
	c.cpu = memberLimits{budgets: opts.CPUBudgets, initial: n, prefix: fmt.Sprintf("oproute-zk-%d", rand.Uint64())}
	c.apartHosts = !opts.Reconfig // a proxy host each (the JVM cannot host them), but none with Reconfig
	for i := range n {
		if err := c.cpu.grow(i); err != nil {
			return nil, err
		}
	}

	// Ports: each server's own three, its proxied client port, its TLS
	// client port, and for every other server a proxied quorum and election
	// port.
	peerProxy := make([][][2]int, n) // [to][from] → quorum, election proxy ports
	// All ports at once: ports released between picks can be picked again.
	per := 5 + 2*(n-1)
	allPorts, err := freePorts(n * per)
	if err != nil {
		return nil, err
	}
	for i, zone := range c.topo.Zones {
		ports := allPorts[i*per : (i+1)*per]
		s := &ZKServer{Index: i, Name: fmt.Sprintf("z%d", i), Zone: zone, SID: n - i,
			clientPort: ports[0], quorumPort: ports[1], electionPort: ports[2], proxyClientPort: ports[3], securePort: ports[4]}
		s.server.name = s.Name
		peerProxy[i] = make([][2]int, n)
		k := 5
		for from := range n {
			if from != i {
				peerProxy[i][from] = [2]int{ports[k], ports[k+1]}
				k += 2
			}
		}
		c.servers = append(c.servers, s)
		c.nodes = append(c.nodes, &s.server)
	}
	for i, s := range c.servers {
		clientTarget := s.clientPort
		if c.tls != nil {
			clientTarget = s.securePort
		}
		links := []zkLink{{Listen: s.proxyClientPort, Target: addr(clientTarget), From: -1}}
		for from := range n {
			if from != i {
				links = append(links,
					zkLink{Listen: peerProxy[i][from][0], Target: addr(s.quorumPort), From: from},
					zkLink{Listen: peerProxy[i][from][1], Target: addr(s.electionPort), From: from})
			}
		}
		s.proxySpec = zkProxySpec{Index: i, Links: links}
		if !opts.Reconfig {
			if err := c.startProxies(ctx, s); err != nil {
				return nil, err
			}
		}
		if err := c.writeConfig(s, peerProxy); err != nil {
			return nil, err
		}
	}
	for _, s := range c.servers {
		if err := c.launchJVM(s); err != nil {
			return nil, err
		}
	}
	for i := range c.servers {
		if err := c.waitServing(ctx, i); err != nil {
			return nil, err
		}
	}
	if c.topo.Leader >= 0 {
		if err := c.MoveLeader(ctx, c.topo.Leader); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func addr(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }

func (c *ZKCluster) serverDir(s *ZKServer) string { return filepath.Join(c.dir, s.Name) }

// writeConfig writes s's zoo.cfg: its own ports as they are, every other
// server's as the proxies of the links from s to it.
func (c *ZKCluster) writeConfig(s *ZKServer, peerProxy [][][2]int) error {
	dir := c.serverDir(s)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data", "myid"), []byte(strconv.Itoa(s.SID)+"\n"), 0o644); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	tick := c.opts.TickTime.Milliseconds()
	var b strings.Builder
	fmt.Fprintf(&b, "tickTime=%d\ninitLimit=10\nsyncLimit=5\n", tick)
	fmt.Fprintf(&b, "dataDir=%s\n", filepath.Join(dir, "data"))
	if c.opts.Reconfig {
		// The client port is in the server's line of the dynamic config.
		b.WriteString("reconfigEnabled=true\nskipACL=yes\nstandaloneEnabled=false\n")
	} else {
		fmt.Fprintf(&b, "clientPort=%d\nclientPortAddress=127.0.0.1\n", s.clientPort)
	}
	// No fsync, as the etcd members run: the test bed measures routing,
	// not disks. No admin server (Jetty on 8080 would clash between servers).
	b.WriteString("forceSync=no\nadmin.enableServer=false\n")
	fmt.Fprintf(&b, "maxClientCnxns=%d\n", c.opts.MaxClientCnxns)
	fmt.Fprintf(&b, "4lw.commands.whitelist=%s\n", strings.Join(c.opts.FourLetterWords, ","))
	if c.opts.ExtendedTypes {
		// zoo.cfg's unknown keys become zookeeper.* system properties.
		b.WriteString("extendedTypesEnabled=true\n")
	}
	if c.tls != nil {
		// Netty serves both ports; the stores are PEM files.
		fmt.Fprintf(&b, "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"+
			"secureClientPort=%d\nsecureClientPortAddress=127.0.0.1\n"+
			"ssl.keyStore.location=%s\nssl.keyStore.type=PEM\nssl.trustStore.location=%s\nssl.trustStore.type=PEM\n",
			s.securePort, c.tls.keyStore, c.tls.trustStore)
	}
	for _, o := range c.servers {
		if c.opts.Reconfig {
			if !o.removed.Load() {
				b.WriteString(o.serverLine() + "\n")
			}
			continue
		}
		q, e := o.quorumPort, o.electionPort
		if o.Index != s.Index {
			q, e = peerProxy[o.Index][s.Index][0], peerProxy[o.Index][s.Index][1]
		}
		fmt.Fprintf(&b, "server.%d=127.0.0.1:%d:%d\n", o.SID, q, e)
	}
	if err := os.WriteFile(filepath.Join(dir, "zoo.cfg"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	log4j := "log4j.rootLogger=WARN, F\nlog4j.appender.F=org.apache.log4j.FileAppender\n" +
		"log4j.appender.F.File=" + filepath.Join(dir, "server.log") + "\n" +
		"log4j.appender.F.layout=org.apache.log4j.PatternLayout\n" +
		"log4j.appender.F.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1}: %m%n\n"
	if err := os.WriteFile(filepath.Join(dir, "log4j.properties"), []byte(log4j), 0o644); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	return nil
}

func (c *ZKCluster) startProxies(ctx context.Context, s *ZKServer) error {
	if err := os.MkdirAll(c.serverDir(s), 0o755); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	logPath := filepath.Join(c.serverDir(s), "proxies.log")
	var p *process
	err := c.withNet(func(net *netState) error {
		s.proxySpec.Net = net
		spec, _ := json.Marshal(s.proxySpec)
		var err error
		p, err = c.startProxyHost(&s.server, s.Index, zkProxyEnv, spec, logPath)
		return err
	})
	if err != nil {
		return err
	}
	return awaitReady(ctx, p, s.Name+" proxies", logPath)
}

func (c *ZKCluster) launchJVM(s *ZKServer) error {
	dir := c.serverDir(s)
	args := []string{fmt.Sprintf("-Xmx%dm", c.opts.HeapMB), "-Xms32m", "-XX:+UseSerialGC", "-XX:-UsePerfData"}
	if c.opts.ContainerCheck > 0 {
		args = append(args, fmt.Sprintf("-Dznode.container.checkIntervalMs=%d", max(1, c.opts.ContainerCheck.Milliseconds())))
	}
	if n := c.cpu.procs(s.Index); n > 0 {
		// What the JVM would count in its cgroup, had it started there.
		args = append(args, fmt.Sprintf("-XX:ActiveProcessorCount=%d", n))
	}
	args = append(args, "-Dzookeeper.log.dir="+dir, "-Dlog4j.configuration=file:"+filepath.Join(dir, "log4j.properties"),
		"-cp", c.opts.ClassPath,
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(dir, "zoo.cfg"))
	cmd := exec.Command("java", args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p, err := startPlain(cmd, filepath.Join(dir, "jvm.out"))
	if err != nil {
		return fmt.Errorf("testbed: start %s: %w", s.Name, err)
	}
	if err := c.cpu.confine(s.Index, cmd.Process.Pid); err != nil {
		p.stop()
		return err
	}
	s.started(p)
	return nil
}

// waitServing polls srvr on server i until it serves as leader or follower.
func (c *ZKCluster) waitServing(ctx context.Context, i int) error {
	s := c.servers[i]
	p := s.process()
	for {
		st, err := c.Srvr(ctx, i)
		if err == nil && (st.Mode == "leader" || st.Mode == "follower") {
			return nil
		}
		select {
		case <-p.exited:
			return startupFailure(s.Name, filepath.Join(c.serverDir(s), "server.log"))
		case <-ctx.Done():
			return fmt.Errorf("testbed: %s not serving (last: %v): %w", s.Name, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Size returns the number of servers.
func (c *ZKCluster) Size() int { return len(c.servers) }

// Topology returns the ensemble's topology.
func (c *ZKCluster) Topology() Topology { return c.topo }

// Server returns server i.
func (c *ZKCluster) Server(i int) *ZKServer { return c.servers[i] }

// TickTime returns the servers' tick.
func (c *ZKCluster) TickTime() time.Duration { return c.opts.TickTime }

// Endpoints returns the client addresses (through the delay proxies), in
// server order: the connect string clients get. With Reconfig they are
// the servers' own client ports, as the ensemble's configuration names
// them; a removed server keeps its place.
func (c *ZKCluster) Endpoints() []string {
	if c.opts.Reconfig {
		return c.DirectEndpoints()
	}
	eps := make([]string, len(c.servers))
	for i, s := range c.servers {
		eps[i] = addr(s.proxyClientPort)
	}
	return eps
}

// DirectEndpoints returns the servers' own client ports, bypassing the
// proxies: for administration.
func (c *ZKCluster) DirectEndpoints() []string {
	eps := make([]string, len(c.servers))
	for i, s := range c.servers {
		eps[i] = addr(s.clientPort)
	}
	return eps
}

// Zones returns each server's zone.
func (c *ZKCluster) Zones() []string { return slices.Clone(c.topo.Zones) }

// Restart starts a killed server again on its data and waits until it
// serves.
func (c *ZKCluster) Restart(ctx context.Context, i int) error {
	if err := c.servers[i].restartable(); err != nil {
		return err
	}
	if err := c.launchJVM(c.servers[i]); err != nil {
		return err
	}
	return c.waitServing(ctx, i)
}

// Close kills every server and proxy process and removes the directory it
// created.
func (c *ZKCluster) Close() error {
	if !c.beginClose() {
		return nil
	}
	untrack(c)
	return c.closeNodes()
}

// serverErrors returns the last ERROR lines of each server's log: what a
// failed test shows of the servers' side (an election that stalled, a
// synchronisation a server gave up).
func (c *ZKCluster) serverErrors() string {
	const keep = 20
	var b strings.Builder
	for _, s := range c.servers {
		raw, err := os.ReadFile(filepath.Join(c.serverDir(s), "server.log"))
		if err != nil {
			fmt.Fprintf(&b, "%s: no server log: %v\n", s.Name, err)
			continue
		}
		var errs []string
		for line := range strings.Lines(string(raw)) {
			if strings.Contains(line, " ERROR ") {
				errs = append(errs, line)
			}
		}
		fmt.Fprintf(&b, "%s: %d ERROR lines in its server.log\n", s.Name, len(errs))
		for _, line := range errs[max(0, len(errs)-keep):] {
			b.WriteString("  " + line)
		}
	}
	return b.String()
}
