package testbed

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// errFrozen: a control question went to a process that Pause froze; it
// answers when it thaws.
var errFrozen = errors.New("testbed: process paused")

// process is a child process: a server (an etcd member, a ZooKeeper JVM)
// or a proxy host. One started by startChild also takes control lines.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}

	// The control side, nil for a process that takes no control lines.
	stdin     io.WriteCloser
	ready     chan struct{}
	readyOnce sync.Once     // the ready line, or a server's own readiness (an etcd of another version)
	askMu     sync.Mutex    // orders lines written with the answers awaited
	waiters   []chan string // one per line written and not yet answered
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

// markReady says the process serves.
func (p *process) markReady() { p.readyOnce.Do(func() { close(p.ready) }) }

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
				p.markReady()
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

// startProxyHost starts the process that hosts member i's proxies apart
// from its server (the member binary, its spec in env variable), moves it
// where its CPU is billed and records it as node's control process. Call
// it within withNet.
func (c *cluster) startProxyHost(node *server, i int, variable string, spec []byte, logPath string) (*process, error) {
	cmd := exec.Command(c.bin)
	cmd.Env = c.cpu.proxyEnv(i, append(os.Environ(), variable+"="+string(spec)))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p, err := startChild(cmd, logPath)
	if err != nil {
		return nil, fmt.Errorf("testbed: start %s proxies: %w", node.name, err)
	}
	if err := c.cpu.confineProxies(i, cmd.Process.Pid); err != nil {
		p.stop()
		return nil, err
	}
	node.controlledBy(p)
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

// waitStopped returns once every thread of process pid has stopped (a
// SIGSTOP is delivered to each thread as it next runs: on a loaded host a
// JVM thread can still answer a request just after kill returns), or has
// ended; it gives up after 5 s.
func waitStopped(name string, pid int) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		stopped, err := allThreadsStopped(pid)
		if err != nil || stopped {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testbed: %s (pid %d) not stopped 5 s after SIGSTOP", name, pid)
		}
		time.Sleep(time.Millisecond) // polling the kernel's view of the process
	}
}

// allThreadsStopped reads each thread's state from /proc/pid/task/*/stat:
// stopped (T, t) or dead (Z, X) for every one. A process that has gone
// counts as stopped: there is nothing left to answer.
func allThreadsStopped(pid int) (bool, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("testbed: threads of pid %d: %w", pid, err)
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue // the thread ended
		}
		// The state follows the command, which is in parentheses and may
		// hold spaces or parentheses of its own.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) {
			return false, fmt.Errorf("testbed: unreadable %s", stat)
		}
		switch stat[i+2] {
		case 'T', 't', 'Z', 'X':
		default:
			return false, nil
		}
	}
	return true, nil
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
