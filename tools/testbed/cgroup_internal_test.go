package testbed

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oproute/oproute/internal/testutil"
)

// requireCPULimit skips the test where this machine gives no cgroup CPU
// controller to write (CI's machine does).
func requireCPULimit(t *testing.T) {
	t.Helper()
	if err := CPULimitAvailable(); err != nil {
		testutil.Skip(t, fmt.Sprintf("no CPU budgets here: %v", err))
	}
}

// confineSelfT confines the test process to cores (skipping where it
// cannot be) and returns the cgroup it came from and ConfineSelf's release.
func confineSelfT(t *testing.T, cores float64) (home string, release func() error) {
	t.Helper()
	requireCPULimit(t)
	home, err := cpuCgroupOf("self")
	if err != nil {
		t.Fatal(err)
	}
	if release, err = ConfineSelf(cores); err != nil {
		t.Fatal(err)
	}
	return home, release
}

// quotaOf reads the cores a cgroup directory allows (v2 cpu.max or v1's
// cfs quota and period); +Inf when unlimited.
func quotaOf(t *testing.T, dir string) float64 {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, "cpu.max")); err == nil {
		f := strings.Fields(string(b))
		if len(f) != 2 || f[0] == "max" {
			return math.Inf(1)
		}
		q, _ := strconv.ParseFloat(f[0], 64)
		p, _ := strconv.ParseFloat(f[1], 64)
		return q / p
	}
	read := func(name string) float64 {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		v, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		return v
	}
	q := read("cpu.cfs_quota_us")
	if q < 0 {
		return math.Inf(1)
	}
	return q / read("cpu.cfs_period_us")
}

// budgetOfPID returns the cgroup directory and the cores process pid may use.
func budgetOfPID(t *testing.T, pid int) (string, float64) {
	t.Helper()
	dir, err := cpuCgroupOf(strconv.Itoa(pid))
	if err != nil {
		t.Fatal(err)
	}
	return dir, quotaOf(t, dir)
}

// TestZKCPUBudgets: every process of a ZooKeeper server, its JVM and its
// proxies, and a JVM started again after a kill, runs in that server's
// cgroup with that server's quota; with ProxiesApart the proxies run on
// the host's share instead. Close removes the cgroups.
func TestZKCPUBudgets(t *testing.T) {
	testutil.NeedsServers(t)
	requireCPULimit(t)
	home, err := cpuCgroupOf("self")
	if err != nil {
		t.Fatal(err)
	}
	for _, apart := range []bool{false, true} {
		t.Run(fmt.Sprintf("ProxiesApart=%v", apart), func(t *testing.T) {
			c, err := StartZK(context.Background(), ZKOptions{CPUBudgets: CPUBudgets{MemberCPUs: []float64{0.3}, ClusterCPU: 1.2, ProxiesApart: apart}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() }) // a failure midway leaves no JVM loading the CPU
			want := []float64{0.3, 0.4, 0.4}
			var dirs []string
			check := func(i int) {
				t.Helper()
				s := c.Server(i)
				jvm, jq := budgetOfPID(t, s.PID())
				proxies, pq := budgetOfPID(t, s.ProxyPID())
				if math.Abs(jq-want[i]) > 1e-9 || math.Abs(c.MemberCPU(i)-want[i]) > 1e-9 {
					t.Errorf("z%d: JVM in %s (%.2f cores), MemberCPU %.2f; want %.2f cores", i, jvm, jq, c.MemberCPU(i), want[i])
				}
				if !apart && jvm != proxies {
					t.Errorf("z%d: JVM in %s, proxies in %s (%.2f cores); want both in one cgroup", i, jvm, proxies, pq)
				}
				if apart && proxies != home {
					t.Errorf("z%d: proxies in %s; want them apart, on the host's share in %s", i, proxies, home)
				}
				dirs = append(dirs, jvm)
			}
			for i := range c.Size() {
				check(i)
			}
			if err := c.Kill(2); err != nil {
				t.Fatal(err)
			}
			if err := c.Restart(context.Background(), 2); err != nil {
				t.Fatal(err)
			}
			check(2)
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			for _, d := range dirs {
				if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("cgroup %s left after Close (%v)", d, err)
				}
			}
		})
	}
}

// TestEtcdCPUBudgetBites: a member given 0.2 cores and kept busy uses no
// more than that, by its own process's CPU time; with the clients
// confined, a member without a budget shares the host, not their cgroup.
func TestEtcdCPUBudgetBites(t *testing.T) {
	testutil.HoldCores(t) // it measures a member's CPU time, which a neighbour's load would take
	home, release := confineSelfT(t, 1.5)
	defer func() {
		if err := release(); err != nil {
			t.Error(err)
		}
	}()
	c := StartEtcdT(t, EtcdOptions{CPUBudgets: CPUBudgets{MemberCPUs: []float64{0, 0.2, 0}}})
	if dir, q := budgetOfPID(t, c.Member(1).PID()); math.Abs(q-0.2) > 1e-9 {
		t.Fatalf("m1 in %s with %.2f cores, want 0.2", dir, q)
	}
	if dir, q := budgetOfPID(t, c.Member(0).PID()); dir != home || !math.IsInf(q, 1) {
		t.Fatalf("m0 in %s limited to %.2f cores, want unconfined in %s", dir, q, home)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Member(1).Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// Load until m1 has burnt 0.6 s of CPU (3 s at its budget; longer when
	// the machine is busy), within 30 s: the evidence, not the window,
	// bounds the run.
	const burn = 600 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cpu0, wall0 := c.Member(1).CPUTime(), time.Now()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				cli.Get(ctx, fmt.Sprintf("k%d", (w+n)%50)) // serializable or not, it costs m1 CPU
			}
		})
	}
	for ctx.Err() == nil && c.Member(1).CPUTime()-cpu0 < burn {
		time.Sleep(50 * time.Millisecond) // sampling m1's CPU time, not synchronising
	}
	cancel()
	wg.Wait()
	burnt, wall := c.Member(1).CPUTime()-cpu0, time.Since(wall0)
	used := burnt.Seconds() / wall.Seconds()
	t.Logf("m1 used %.3f cores under load (%v of CPU in %v), budget 0.2", used, burnt, wall)
	if burnt < burn {
		t.Fatalf("m1 burnt only %v of CPU in %v: the load did not reach it, the test shows nothing", burnt, wall)
	}
	// /proc's times tick at 10 ms: allow a little over the quota.
	if used > 0.25 {
		t.Errorf("m1 used %.3f cores, more than its 0.2 budget allows", used)
	}
}

// TestConfineSelf: the calling process moves into a cgroup of its own with
// the quota asked, and release moves it back and removes the cgroup.
func TestConfineSelf(t *testing.T) {
	home, release := confineSelfT(t, 1.5)
	dir, q := budgetOfPID(t, os.Getpid())
	if dir == home || math.Abs(q-1.5) > 1e-9 {
		t.Errorf("confined to %s with %.2f cores, want a new cgroup (not %s) with 1.5", dir, q, home)
	}
	if _, err := ConfineSelf(1); err == nil {
		t.Error("a second ConfineSelf succeeded, want it refused")
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if back, _ := cpuCgroupOf("self"); back != home {
		t.Errorf("after release in %s, want %s", back, home)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s left after release (%v)", dir, err)
	}
	if _, err := ConfineSelf(0.05); err == nil {
		t.Error("ConfineSelf(0.05) succeeded, want the 0.1-core minimum refused")
	}
}

// TestEtcdProxiesApart: with ProxiesApart each member's proxies run in a
// process of their own on the host's share, outside its budget; they
// still carry its traffic and take network changes (while the member is
// paused too), their CPU is counted apart and within the member's, they
// outlive a kill of the member, which a restart brings back behind them,
// and Close ends them.
func TestEtcdProxiesApart(t *testing.T) {
	requireCPULimit(t)
	home, err := cpuCgroupOf("self")
	if err != nil {
		t.Fatal(err)
	}
	c := StartEtcdT(t, EtcdOptions{CPUBudgets: CPUBudgets{ClusterCPU: 1.5, ProxiesApart: true}})
	if !c.ProxiesApart() {
		t.Error("ProxiesApart() is false")
	}
	for i := range c.Size() {
		m := c.Member(i)
		if m.ProxyPID() == 0 || m.ProxyPID() == m.PID() {
			t.Fatalf("m%d: proxies in process %d, member %d: want a process of their own", i, m.ProxyPID(), m.PID())
		}
		if dir, q := budgetOfPID(t, m.PID()); math.Abs(q-0.5) > 1e-9 {
			t.Errorf("m%d in %s with %.2f cores, want 0.5", i, dir, q)
		}
		if dir, _ := budgetOfPID(t, m.ProxyPID()); dir != home {
			t.Errorf("m%d's proxies in %s, want the host's share in %s", i, dir, home)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Member(1).Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// Serializable reads: clientv3 retries them on a connection that a
	// blackhole broke, where it would not resend a write.
	get := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := cli.Get(ctx, "k", clientv3.WithSerializable())
		return err
	}
	// Load until m1's proxies have used 30 ms of CPU (ticks are 10 ms),
	// within 30 s: their CPU counts apart from the member's.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := get(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		if _, proxies := c.CPUTimes(); proxies[1] >= 30*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			_, proxies := c.CPUTimes()
			t.Fatalf("m1's proxies used %v of CPU in 30 s of reads through them", proxies[1])
		}
	}
	own, _ := ProcessCPU(c.Member(1).PID())
	proxies, _ := ProcessCPU(c.Member(1).ProxyPID())
	if got := c.Member(1).CPUTime(); got < own+proxies {
		t.Errorf("m1's CPUTime %v, less than its process's %v and its proxies' %v", got, own, proxies)
	}
	c.Blackhole(1, true)
	if err := get(500 * time.Millisecond); err == nil {
		t.Error("a read through blackholed m1's proxies succeeded: the network change did not reach them")
	}
	c.Blackhole(1, false)
	if err := get(10 * time.Second); err != nil {
		t.Fatalf("after the blackhole: %v", err)
	}
	// A network change while the member is paused reaches its proxies,
	// which do not freeze with it.
	if err := c.Pause(1); err != nil {
		t.Fatal(err)
	}
	c.Blackhole(1, true)
	if err := c.Resume(1); err != nil {
		t.Fatal(err)
	}
	if err := get(500 * time.Millisecond); err == nil {
		t.Error("a read through m1's proxies, blackholed while it was paused, succeeded")
	}
	c.Blackhole(1, false)
	proxyPID := c.Member(1).ProxyPID()
	if err := c.Kill(1); err != nil {
		t.Fatal(err)
	}
	if got := c.Member(1).ProxyPID(); got != proxyPID {
		t.Fatalf("after m1's kill its proxies run as %d, want %d still", got, proxyPID)
	}
	if err := c.Restart(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if got := c.Member(1).ProxyPID(); got != proxyPID {
		t.Errorf("after m1's restart its proxies run as %d, want %d", got, proxyPID)
	}
	// gRPC backed off while the proxies accepted and closed its dials.
	if err := get(30 * time.Second); err != nil {
		t.Errorf("through m1's proxies after its restart: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(proxyPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("m1's proxy host %d after Close: %v, want it gone", proxyPID, err)
	}
}
