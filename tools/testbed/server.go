package testbed

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The server process of one member, which etcd clusters and ZooKeeper
// ensembles share: pause, kill, restart checks. Beside it: process.go
// (child processes and their control lines, start-up failure detection),
// faults.go (the emulated network, its fault knobs, leadership moves),
// binary.go (the member binary, ports, work directories).

// Sentinel errors.
var (
	ErrNoLeader   = errors.New("testbed: no leader")
	ErrNotRunning = errors.New("testbed: member not running")
)

// server is the process side of one member, embedded in EtcdMember and
// ZKServer: the server process, which Pause, Kill and Restart act on, and
// the process that hosts the member's proxies and takes control lines. An
// etcd member hosts its own proxies, so both are one, unless
// CPUBudgets.ProxiesApart; a ZooKeeper server's run in a process of their
// own. A proxy host apart is one Pause and Kill leave alone.
type server struct {
	name string // m0, z0: for errors

	mu     sync.Mutex
	proc   *process      // the server process; nil before the first start
	ctl    *process      // the proxy host
	frozen chan struct{} // closed while Pause holds proc stopped

	removed atomic.Bool // taken out of the cluster's membership for good
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

// ProxyPID returns the ID of the process that hosts the member's proxies
// when it runs apart from the server process (always for ZooKeeper; for
// etcd with CPUBudgets.ProxiesApart), 0 when it does not run or is the
// server process itself.
func (s *server) ProxyPID() int {
	s.mu.Lock()
	proc, ctl := s.proc, s.ctl
	s.mu.Unlock()
	if ctl == proc {
		return 0
	}
	return ctl.pid()
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
	err := signalProcess(s.name, p.pid(), syscall.SIGSTOP)
	if err == nil {
		err = waitStopped(s.name, p.pid())
	}
	if err != nil {
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

// restartable fails when the server was removed or its process runs:
// Restart's precondition.
func (s *server) restartable() error {
	if s.removed.Load() {
		return fmt.Errorf("testbed: %s was removed from the cluster", s.name)
	}
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
	r, _, err := s.askHost(msg, timeout)
	return r, err
}

// askHost is ask that also returns the proxy host that answered, for
// answers that hold since that host started (its counters).
func (s *server) askHost(msg control, timeout time.Duration) (string, *process, error) {
	s.mu.Lock()
	p, frozen := s.ctl, s.frozen
	if p != s.proc {
		frozen = nil // the host runs apart and is never paused
	}
	s.mu.Unlock()
	if !p.running() {
		return "", nil, fmt.Errorf("%w: %s", ErrNotRunning, s.name)
	}
	r, err := p.ask(msg, timeout, frozen)
	if err != nil {
		return "", nil, fmt.Errorf("testbed: %s: %w", s.name, err)
	}
	return r, p, nil
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

// servedBy is what count says s served, zero while s is not running.
func servedBy(s *server, count func() (Served, error)) (Served, error) {
	if s.PID() == 0 {
		return Served{}, nil
	}
	return count()
}
