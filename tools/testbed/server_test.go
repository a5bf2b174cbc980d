package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/oproute/oproute/tools/testbed/proxy"
)

// TestLinkFaults: each knob's fault lands on the links it names and no
// others.
func TestLinkFaults(t *testing.T) {
	topo := DefaultTopology(3) // a, a, b
	base := func() *netState {
		return &netState{Topo: topo, Extra: make([]linkExtra, 3), IDs: map[string]int{"0": 0, "1": 1, "2": 2}}
	}
	same, cross := time.Duration(topo.SameZone), time.Duration(topo.CrossZone)

	n := base()
	n.Extra[1].Partitioned = true
	for _, tc := range []struct {
		self int
		from string
		hole bool
	}{{1, "0", true}, {1, "2", true}, {1, "", true}, {0, "1", true}, {2, "1", true}, {0, "2", false}, {2, "0", false}, {0, "", false}} {
		if got := n.peerLink(tc.self, tc.from).Stall; got != tc.hole {
			t.Errorf("Partition(1): peer link into %d from %q stalled %v, want %v", tc.self, tc.from, got, tc.hole)
		}
	}
	if l := n.clientLink(1); l.Blackhole || l.Reset || l.Delay != same {
		t.Errorf("Partition(1): client link %+v, want untouched", l)
	}

	n = base()
	n.Extra[2].PeerDelay, n.Extra[2].PeerJitter = 5*time.Millisecond, time.Millisecond
	if l := n.peerLink(0, "2"); l.Delay != cross+5*time.Millisecond || l.Jitter < time.Millisecond {
		t.Errorf("DegradePeers(2): link into 0 from 2 %+v, want +5ms ±1ms", l)
	}
	if l := n.peerLink(2, "1"); l.Delay != cross+5*time.Millisecond {
		t.Errorf("DegradePeers(2): link into 2 from 1 %+v, want +5ms", l)
	}
	if l := n.peerLink(0, "1"); l.Delay != same {
		t.Errorf("DegradePeers(2): link between 0 and 1 %+v, want untouched", l)
	}
	if l := n.clientLink(2); l.Delay != cross {
		t.Errorf("DegradePeers(2): client link %+v, want untouched", l)
	}

	n = base()
	n.Extra[2].Delay = 5 * time.Millisecond // Degrade(2): every link of member 2, both ways
	for _, l := range []struct {
		name string
		got  proxy.Link
		want time.Duration
	}{{"peer link into 0 from 2", n.peerLink(0, "2"), cross}, {"peer link into 2 from 1", n.peerLink(2, "1"), cross}, {"client link", n.clientLink(2), cross}} {
		if l.got.Delay != l.want+5*time.Millisecond {
			t.Errorf("Degrade(2): %s %+v, want +5ms", l.name, l.got)
		}
	}
	if l := n.peerLink(0, "1"); l.Delay != same {
		t.Errorf("Degrade(2): link between 0 and 1 %+v, want untouched", l)
	}

	n = base()
	n.Extra[0].ResetClients = true
	if l := n.clientLink(0); !l.Reset {
		t.Errorf("ResetClients(0): client link %+v, want Reset", l)
	}
	if n.clientLink(1).Reset || n.peerLink(0, "1").Reset || n.peerLink(1, "0").Reset {
		t.Error("ResetClients(0) reset a peer link or another member's client link")
	}
}

// TestMoveLeaderGivesUp: hand-overs that elect someone else count, and
// after 2×size of them moveLeader gives up; refused ones are retried.
func TestMoveLeaderGivesUp(t *testing.T) {
	ctx := context.Background()
	// ZooKeeper-like: each hand-over elects the other of 0 and 1, never 2.
	leader, moves := 0, 0
	err := moveLeader(ctx, 3, 2, "z2", func(context.Context) (int, error) { return leader, nil },
		func(_ context.Context, from int) error { moves++; leader = 1 - from; return nil })
	if !errors.Is(err, ErrNoLeader) || moves != 6 {
		t.Errorf("never electable: %v after %d hand-overs, want ErrNoLeader after 6", err, moves)
	}
	// etcd-like: two refusals, then the transfer.
	leader, moves = 0, 0
	err = moveLeader(ctx, 3, 2, "m2", func(context.Context) (int, error) { return leader, nil },
		func(context.Context, int) error {
			if moves++; moves == 3 {
				leader = 2
			}
			return nil
		})
	if err != nil || moves != 3 {
		t.Errorf("refused twice: %v after %d hand-overs, want success after 3", err, moves)
	}
}

// TestAskKeepsAnswersPaired: a question that stopped waiting (its process
// froze) does not leave its answer to the next one.
func TestAskKeepsAnswersPaired(t *testing.T) {
	r, w := io.Pipe()
	go io.Copy(io.Discard, r)
	defer w.Close()
	p := &process{cmd: exec.Command("true"), stdin: w, exited: make(chan struct{})}
	frozen := make(chan struct{})
	close(frozen)
	if _, err := p.ask(control{Query: "accepted"}, time.Second, frozen); !errors.Is(err, errFrozen) {
		t.Fatalf("ask of a frozen process: %v, want errFrozen", err)
	}
	got := make(chan string)
	go func() {
		a, err := p.ask(control{Query: "accepted"}, 5*time.Second, nil)
		if err != nil {
			a = err.Error()
		}
		got <- a
	}()
	for deadline := time.Now().Add(5 * time.Second); ; {
		p.askMu.Lock()
		n := len(p.waiters)
		p.askMu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("second question not asked")
		}
		time.Sleep(time.Millisecond)
	}
	p.answered("accepted 1") // the frozen one's, late
	p.answered("accepted 2")
	if a := <-got; a != "accepted 2" {
		t.Fatalf("second question got %q, want its own answer", a)
	}
}

// A cluster leaves nothing in the temporary directory once closed: not its
// work directory, not the member binary a race build compiles (it runs from
// memory). Only this process's entries count: test binaries running beside
// it have their own.
func TestNothingLeftInTmp(t *testing.T) {
	leftovers := func() []string {
		pid := os.Getpid()
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf("oproute-*-%d-*", pid)))
		bins, _ := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf("%s%d", memberBinaryPrefix, pid)))
		return append(dirs, bins...)
	}
	before := leftovers()
	c := StartEtcdT(t, EtcdOptions{})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range leftovers() {
		if !slices.Contains(before, p) {
			t.Errorf("left behind: %s", p)
		}
	}
}

// A pause returns only once every thread has stopped: a JVM thread still
// to be scheduled could otherwise answer a request sent just after it.
func TestWaitStoppedSeesEveryThreadStop(t *testing.T) {
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if stopped, err := allThreadsStopped(cmd.Process.Pid); stopped || err != nil {
		t.Fatalf("a spinning process reads as stopped: %v %v", stopped, err)
	}
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := waitStopped("sh", cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if stopped, _ := allThreadsStopped(cmd.Process.Pid); stopped {
		t.Fatal("a continued process reads as stopped")
	}
}
