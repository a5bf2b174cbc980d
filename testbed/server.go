package testbed

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// This file holds what etcd clusters and ZooKeeper ensembles share: child
// processes and their control lines, the server process of each member
// (pause, kill, restart checks), the emulated network and its fault knobs,
// start-up failure detection and leadership moves.

// Sentinel errors.
var (
	ErrNoLeader   = errors.New("testbed: no leader")
	ErrNotRunning = errors.New("testbed: member not running")
)

// errPortTaken: a member could not bind a port picked for it; another
// process took it between the pick and the bind.
var errPortTaken = errors.New("testbed: port taken")

// errFrozen: a control question went to a process that Pause froze; it
// answers when it thaws.
var errFrozen = errors.New("testbed: process paused")

// process is a child process: a server (an etcd member, a ZooKeeper JVM)
// or a proxy host. One started by startChild also takes control lines.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}

	// The control side, nil for a process that takes no control lines.
	stdin   io.WriteCloser
	ready   chan struct{}
	askMu   sync.Mutex    // orders lines written with the answers awaited
	waiters []chan string // one per line written and not yet answered
}

func (p *process) running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// pid returns the process ID, 0 when it is not running.
func (p *process) pid() int {
	if !p.running() {
		return 0
	}
	return p.cmd.Process.Pid
}

// stop kills the process (SIGKILL works on a stopped one too), closes its
// control input and waits for it to end.
func (p *process) stop() {
	p.cmd.Process.Kill()
	if p.stdin != nil {
		p.stdin.Close()
	}
	<-p.exited
}

// ask sends one control line and waits for its answer, at most timeout,
// and not at all once frozen is closed (the process was paused: it answers
// when it thaws). Answers come in the order of the lines, so each goes to
// its own question even when an earlier asker stopped waiting.
func (p *process) ask(msg control, timeout time.Duration, frozen <-chan struct{}) (string, error) {
	line, _ := json.Marshal(msg)
	reply := make(chan string, 1)
	p.askMu.Lock()
	p.waiters = append(p.waiters, reply)
	_, err := p.stdin.Write(append(line, '\n'))
	p.askMu.Unlock()
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNotRunning, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-reply:
		return r, nil
	case <-p.exited:
		return "", ErrNotRunning
	case <-frozen:
		return "", errFrozen
	case <-t.C:
		return "", fmt.Errorf("testbed: no answer to %s within %v", line, timeout)
	}
}

// answered hands an answer line to the oldest waiting question.
func (p *process) answered(line string) {
	p.askMu.Lock()
	defer p.askMu.Unlock()
	if len(p.waiters) == 0 {
		return // nobody asked; drop
	}
	p.waiters[0] <- line // buffered for one: never blocks
	p.waiters = p.waiters[1:]
}

// startChild starts cmd with stderr to logPath and its stdout read for the
// ready line and control answers.
func startChild(cmd *exec.Cmd, logPath string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &process{cmd: cmd, stdin: stdin, ready: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == readyLine {
				close(p.ready)
				continue
			}
			p.answered(sc.Text())
		}
	}()
	go func() {
		cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

// startPlain starts cmd with stdout and stderr to logPath.
func startPlain(cmd *exec.Cmd, logPath string) (*process, error) {
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		out.Close()
		close(p.exited)
	}()
	return p, nil
}

// server is the process side of one member, embedded in EtcdMember and
// ZKServer: the server process, which Pause, Kill and Restart act on, and
// the process that hosts the member's proxies and takes control lines. An
// etcd member hosts its own proxies, so both are one; a ZooKeeper server's
// run in a process of their own, which Pause and Kill leave alone.
type server struct {
	name string // m0, z0: for errors

	mu     sync.Mutex
	proc   *process      // the server process; nil before the first start
	ctl    *process      // the proxy host
	frozen chan struct{} // closed while Pause holds proc stopped
}

func (s *server) process() *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

func (s *server) control() *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctl
}

// started records a newly started server process, not paused.
func (s *server) started(p *process) {
	s.mu.Lock()
	s.proc, s.frozen = p, make(chan struct{})
	s.mu.Unlock()
}

// controlledBy records the process that hosts the member's proxies.
func (s *server) controlledBy(p *process) {
	s.mu.Lock()
	s.ctl = p
	s.mu.Unlock()
}

// PID returns the ID of the member's server process (the etcd member, the
// ZooKeeper JVM), 0 when it is not running.
func (s *server) PID() int { return s.process().pid() }

func (s *server) paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return isClosed(s.frozen)
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// pause stops the server process. It is marked paused before the signal,
// so that a control question racing with it (a network change) stops
// waiting for a process about to freeze, and unmarked if the signal fails.
func (s *server) pause() error {
	s.mu.Lock()
	p, frozen := s.proc, s.frozen
	mark := p.running() && !isClosed(frozen)
	if mark {
		close(frozen)
	}
	s.mu.Unlock()
	if err := signalProcess(s.name, p.pid(), syscall.SIGSTOP); err != nil {
		if mark {
			s.mu.Lock()
			if s.frozen == frozen {
				s.frozen = make(chan struct{})
			}
			s.mu.Unlock()
		}
		return err
	}
	return nil
}

// resume continues the server process and marks it running.
func (s *server) resume() error {
	p := s.process()
	if err := signalProcess(s.name, p.pid(), syscall.SIGCONT); err != nil {
		return err
	}
	s.mu.Lock()
	if s.proc == p && isClosed(s.frozen) {
		s.frozen = make(chan struct{})
	}
	s.mu.Unlock()
	return nil
}

// signalProcess signals a server's process; pid 0 means it is not running.
func signalProcess(name string, pid int, sig syscall.Signal) error {
	if pid == 0 {
		return fmt.Errorf("%w: %s", ErrNotRunning, name)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("testbed: signal %s: %w", name, err)
	}
	return nil
}

// kill crashes the server process (SIGKILL) and waits for it to end.
func (s *server) kill() error {
	p := s.process()
	if !p.running() {
		return fmt.Errorf("%w: %s", ErrNotRunning, s.name)
	}
	p.cmd.Process.Kill()
	<-p.exited
	return nil
}

// stopped fails when the server process runs: Restart's precondition.
func (s *server) stopped() error {
	if s.PID() != 0 {
		return fmt.Errorf("testbed: %s is running", s.name)
	}
	return nil
}

// close stops the server process and the proxy host.
func (s *server) close() {
	s.mu.Lock()
	proc, ctl := s.proc, s.ctl
	s.mu.Unlock()
	if proc != nil {
		proc.stop()
	}
	if ctl != nil && ctl != proc {
		ctl.stop()
	}
}

// ask sends one control line to the member's proxy host. It does not wait
// for a host that Pause froze (an etcd member's own process): that one
// answers when it thaws.
func (s *server) ask(msg control, timeout time.Duration) (string, error) {
	s.mu.Lock()
	p, frozen := s.ctl, s.frozen
	if p != s.proc {
		frozen = nil // the host runs apart and is never paused
	}
	s.mu.Unlock()
	if !p.running() {
		return "", fmt.Errorf("%w: %s", ErrNotRunning, s.name)
	}
	r, err := p.ask(msg, timeout, frozen)
	if err != nil {
		return "", fmt.Errorf("testbed: %s: %w", s.name, err)
	}
	return r, nil
}

// clientConnections returns how many connections the member's client proxy
// has accepted since its host started, 0 when it cannot tell.
func (s *server) clientConnections() uint64 {
	r, err := s.ask(control{Query: "accepted"}, 5*time.Second)
	if err != nil {
		return 0
	}
	var n uint64
	fmt.Sscanf(r, "accepted %d", &n)
	return n
}

// cluster is embedded in EtcdCluster and ZKCluster: the emulated network,
// which every member's proxies shape by, and the fault knobs.
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
	// Zones returns each member's zone, in member order.
	Zones() []string
}

var (
	_ Faults = (*EtcdCluster)(nil)
	_ Faults = (*ZKCluster)(nil)
)

// Served is what one member served, by its own count: etcd's /metrics,
// ZooKeeper's mntr.
type Served struct {
	// Writes are client writes received, not proposals forwarded to the
	// member (ZooKeeper: updates, session creation included).
	Writes uint64
	// Reads are client reads (ZooKeeper: a linearizable read's sync too).
	Reads uint64
	// Txns are etcd transactions, of either kind.
	Txns uint64
}

type cluster struct {
	netMu sync.Mutex // serialises changes of net and their broadcast
	net   *netState
	nodes []*server // the members' processes, in member order
}

// setNet changes the network state and sends it to every member's proxies,
// returning once each has applied it. A member frozen by Pause is not
// waited for: it applies the change when it thaws.
func (c *cluster) setNet(change func(*netState)) {
	c.netMu.Lock()
	defer c.netMu.Unlock()
	next := c.net.clone()
	change(next)
	c.net = next
	for _, s := range c.nodes {
		s.ask(control{Net: next}, 5*time.Second)
	}
}

// grow adds member i's process (not yet started) to the cluster, in zone,
// with its peer links known by id (the key peerLink looks senders up by),
// and tells the running members' proxies.
func (c *cluster) grow(node *server, i int, zone, id string) {
	c.netMu.Lock()
	c.nodes = append(c.nodes, node)
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

// Pause freezes member i's server process (SIGSTOP): its TCP connections
// stay open and its kernel still accepts new ones; nothing answers. An etcd
// member's proxies run in its process and freeze with it; a ZooKeeper
// server's run apart and keep accepting.
func (c *cluster) Pause(i int) error { return c.nodes[i].pause() }

// Resume continues a paused member (SIGCONT).
func (c *cluster) Resume(i int) error { return c.nodes[i].resume() }

// Kill crashes member i's server process (SIGKILL: no leadership
// hand-over) and waits for it to end.
func (c *cluster) Kill(i int) error { return c.nodes[i].kill() }

// moveLeader hands leadership on until member to holds it, for both
// backends: handOver moves it away from the current leader (etcd asks the
// leader to transfer it; ZooKeeper, which cannot, restarts the leader). A
// hand-over that leaves the leader in place (a refused transfer) is retried
// while ctx lasts; one that elects another member than to counts, and
// after 2×size of those moveLeader gives up (ZooKeeper elects by zxid, then
// by myid, so a server may never win).
func moveLeader(ctx context.Context, size, to int, target string, waitLeader func(context.Context) (int, error), handOver func(ctx context.Context, from int) error) error {
	prev, missed := -1, 0
	for {
		cur, err := waitLeader(ctx)
		if err != nil {
			return err
		}
		if cur == to {
			return nil
		}
		if prev >= 0 && cur != prev {
			if missed++; missed >= 2*size {
				return fmt.Errorf("testbed: %s did not win an election: %w", target, ErrNoLeader)
			}
		}
		if err := handOver(ctx, cur); err != nil {
			return err
		}
		prev = cur
	}
}

// awaitReady waits for a child's ready line.
func awaitReady(ctx context.Context, p *process, name, logPath string) error {
	select {
	case <-p.ready:
		return nil
	case <-p.exited:
		return startupFailure(name, logPath)
	case <-ctx.Done():
		return fmt.Errorf("testbed: %s not ready: %w", name, ctx.Err())
	}
}

// startupFailure tells why a process exited during start-up from the tail
// of its log; errPortTaken when it could not bind a port.
func startupFailure(name, logPath string) error {
	log, _ := os.ReadFile(logPath)
	if len(log) > 3000 {
		log = log[len(log)-3000:]
	}
	err := fmt.Errorf("testbed: %s exited during start-up: %s", name, log)
	// etcd says "address already in use", Java "Address already in use".
	if strings.Contains(strings.ToLower(string(log)), "address already in use") {
		err = fmt.Errorf("%w: %w", errPortTaken, err)
	}
	return err
}

// retryPortTaken runs start up to three times while it fails because a
// picked port was taken.
func retryPortTaken[C any](start func() (C, error)) (C, error) {
	for attempt := 1; ; attempt++ {
		c, err := start()
		if err == nil || !errors.Is(err, errPortTaken) || attempt == 3 {
			return c, err
		}
	}
}

// workDir returns dir, or a new temporary directory (own: Close removes it)
// when dir is empty.
func workDir(dir, prefix string) (_ string, own bool, err error) {
	if dir != "" {
		return dir, false, nil
	}
	if dir, err = os.MkdirTemp("", prefix); err != nil {
		return "", false, fmt.Errorf("testbed: %w", err)
	}
	return dir, true, nil
}

// memberBinary returns the executable that runs etcd members and proxy
// hosts: this one, unless it is race-instrumented, in which case a plain
// build of etcdmember (the race detector would slow the servers
// several-fold and skew every timing).
func memberBinary(ctx context.Context, dir string) (string, error) {
	if bin := os.Getenv("OPROUTE_ETCD_MEMBER_BIN"); bin != "" {
		return bin, nil
	}
	if !raceEnabled {
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("testbed: %w", err)
		}
		return self, nil
	}
	memberBuild.once.Do(func() {
		sweepMemberBinaries()
		out := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d", memberBinaryPrefix, os.Getpid()))
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/oproute/oproute/testbed/internal/etcdmember")
		if b, err := cmd.CombinedOutput(); err != nil {
			os.Remove(out)
			memberBuild.err = fmt.Errorf("testbed: building the member binary: %w\n%s", err, b)
			return
		}
		memberBuild.path, memberBuild.err = inMemory(out)
	})
	return memberBuild.path, memberBuild.err
}

var memberBuild struct {
	once sync.Once
	path string
	err  error
	mem  *os.File // the memory file path executes
}

// inMemory moves the executable at path into an anonymous memory file and
// returns a path that executes it (/proc/<pid>/fd/<n>, valid while this
// process lives): nothing is left on disk when the process ends, however
// it ends.
func inMemory(path string) (string, error) {
	fd, err := unix.MemfdCreate("oproute-etcdmember", 0)
	if err != nil {
		return path, nil // no memfd: run it from disk; the sweep removes it later
	}
	defer os.Remove(path)
	mem := os.NewFile(uintptr(fd), "oproute-etcdmember")
	src, err := os.Open(path)
	if err != nil {
		mem.Close()
		return "", fmt.Errorf("testbed: %w", err)
	}
	defer src.Close()
	if _, err := io.Copy(mem, src); err != nil {
		mem.Close()
		return "", fmt.Errorf("testbed: copying the member binary: %w", err)
	}
	memberBuild.mem = mem // kept open for the life of the process
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd), nil
}

// memberBinaryPrefix names member binaries in the temporary directory,
// followed by the ID of the process that built it.
const memberBinaryPrefix = "oproute-etcdmember-"

// sweepMemberBinaries removes the member binaries of processes that have
// ended: nothing else removes them, and each is tens of megabytes.
func sweepMemberBinaries() {
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), memberBinaryPrefix+"*"))
	for _, path := range old {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(path), memberBinaryPrefix))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.Remove(path)
		}
	}
}

func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testbed: free port: %w", err)
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}
