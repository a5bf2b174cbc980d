package bench

import (
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/oproute/oproute/tools/testbed"
)

// MinClientCPU is the least a client process is confined to: below half a
// core the clients, not the members, would set the pace.
const MinClientCPU = 0.5

// DefaultBudgets are the CPU budgets routebench runs with where the test
// bed can confine processes: the client process keeps a quarter of the
// host (at least MinClientCPU) and the members share the rest equally,
// each confined as if on a machine of its own. On two cores: the client
// 0.5, three members 0.5 each (five 0.3 each). Members that share cores
// unconfined let a busy member slow the others and the client, which
// favours policies that send reads to one member.
func DefaultBudgets(cpus int) (members testbed.CPUBudgets, client float64) {
	client = max(MinClientCPU, float64(cpus)/4)
	return testbed.CPUBudgets{ClusterCPU: float64(cpus) - client}, client
}

// bedCPU is a test-bed cluster's CPU accounting: its members' processes
// and their proxies' (testbed's CPUTimes), and whether the proxies run
// apart, so that their part can be told.
type bedCPU interface {
	CPUTimes() (members, proxies []time.Duration)
	ProxiesApart() bool
}

// onBed is a Cluster on the test bed, whose CPU can be accounted.
type onBed interface{ bed() bedCPU }

// membersCPU is what each member's processes have used so far, nil off
// the test bed.
func membersCPU(b bedCPU) []time.Duration {
	if b == nil {
		return nil
	}
	members, _ := b.CPUTimes()
	return members
}

// BudgetsOf returns the CPU budgets of a test-bed backend, one that has
// testbed.CPUBudgets' Budgets method (by embedding Etcd, say); zero for
// others: shared cores.
func BudgetsOf(be Backend) testbed.CPUBudgets {
	if b, ok := be.(interface{ Budgets() testbed.CPUBudgets }); ok {
		return b.Budgets()
	}
	return testbed.CPUBudgets{}
}

// WithProxiesApart returns be with its members' proxies billed apart from
// their budgets (testbed.CPUBudgets.ProxiesApart), when it is a test-bed
// backend.
func WithProxiesApart(be Backend) Backend {
	b := BudgetsOf(be)
	b.ProxiesApart = true
	return withBudgets(be, b)
}

// withBudgets returns be with budgets b, when it is a test-bed backend.
func withBudgets(be Backend, b testbed.CPUBudgets) Backend {
	switch be.(type) {
	case Etcd:
		return Etcd{CPUBudgets: b}
	case ZooKeeper:
		return ZooKeeper{CPUBudgets: b}
	}
	return be
}

// The CPU modes' short names (CPUModeName), each a CPUMode line's opening.
const (
	CPUModeBudgets = "budgets"
	CPUModeShared  = "shared cores"
	// CPUModeSimulated: routebench --sim, no CPU measured.
	CPUModeSimulated = "simulated"
)

// CPUModeName is the short name of a CPUMode line: CPUModeBudgets or
// CPUModeShared; "" for none (a cluster not on the test bed).
func CPUModeName(mode string) string {
	for _, n := range []string{CPUModeBudgets, CPUModeShared, CPUModeSimulated} {
		if strings.HasPrefix(mode, "CPU: "+n) {
			return n
		}
	}
	return ""
}

// CPUMode says in one line how a run on the test bed shares the host's
// CPU: each member's budget and the client's, or shared cores and what
// that changes. clientCPU is the client process's budget, 0 unconfined.
func CPUMode(be Backend, nodes int, clientCPU float64) string {
	if sb, ok := be.(simBackend); ok {
		capacity := "one core each"
		if sb.cores != nil {
			capacity = fmt.Sprintf("%v cores", sb.cores)
		}
		return fmt.Sprintf("CPU: "+CPUModeSimulated+" %s (package sim, costs not calibrated: %+v): each member one FIFO CPU in virtual time, %s; no client or server CPU is measured.", sb.store, sb.storeCosts(), capacity)
	}
	b := BudgetsOf(be)
	cpus := runtime.NumCPU()
	if !b.Confined() {
		who := "the members, their proxies and the client"
		if b.ProxiesApart {
			who = "the members, the client and, in processes of their own, the members' proxies"
		}
		return fmt.Sprintf("CPU: "+CPUModeShared+": %s run unconfined on the host's %d CPUs, so a busy member slows the others and the client, which favours sending reads to one member (leader_only, boltzmann) over spreading them.", who, cpus)
	}
	each := make([]string, nodes)
	for i := range nodes {
		each[i] = fmt.Sprintf("%.3g", b.Of(i, nodes))
	}
	client := "the client unconfined (it can take CPU the members' budgets assume)"
	if clientCPU > 0 {
		client = fmt.Sprintf("the client %.3g", clientCPU)
	}
	proxies := "proxies included"
	if b.ProxiesApart {
		proxies = "their proxies apart on the host's shared cores, as a kernel's network would be"
	}
	return fmt.Sprintf("CPU: "+CPUModeBudgets+" (cgroup quotas) of %s cores for members m0…m%d, %s, and %s, on a host of %d CPUs: as if each ran on a machine of its own.",
		strings.Join(each, " / "), nodes-1, proxies, client, cpus)
}
