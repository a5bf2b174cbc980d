package testbed

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// ErrNoCPULimit: the machine offers no writable cgroup CPU controller, so
// CPU budgets cannot be honoured.
var ErrNoCPULimit = errors.New("testbed: no writable cgroup cpu controller")

// CPUBudgets give members CPU budgets (cgroup quotas, each member's proxies
// included unless ProxiesApart), as if each ran on a machine of its own;
// the zero value leaves them unconfined, sharing the host's cores. A
// cluster with budgets fails to start with ErrNoCPULimit where cgroups
// cannot be written (CPULimitAvailable says beforehand).
type CPUBudgets struct {
	// MemberCPUs gives each member its own budget, in member order:
	// members of unequal capacity, as on machines of different sizes. A
	// member beyond its end, or with 0, gets MemberCPU, or else its share
	// of ClusterCPU.
	MemberCPUs []float64
	// MemberCPU is every other member's budget, in cores.
	MemberCPU float64
	// ClusterCPU ÷ the number of members the cluster starts with is the
	// budget of every member that MemberCPUs and MemberCPU leave without
	// one (members added later get the same): a budget for the host's
	// members that suits any cluster size.
	ClusterCPU float64
	// ProxiesApart runs each member's proxies (the emulated network) in a
	// process of their own outside its budget, sharing the host's cores,
	// as a kernel's network stack serves a machine's traffic outside its
	// processes' quotas. By default an etcd member hosts its proxies in its
	// own process and a ZooKeeper server's proxy host joins its budget, so
	// the emulated network costs the member as if it were its own work.
	// Apart, a member's proxies keep running while it is killed or
	// paused, and their CPU time is counted on its own (ProxyCPUTime).
	ProxiesApart bool
}

// Budgets returns b; backends that embed CPUBudgets have it too.
func (b CPUBudgets) Budgets() CPUBudgets { return b }

// Confined reports whether any member has a budget.
func (b CPUBudgets) Confined() bool {
	return b.MemberCPU > 0 || b.ClusterCPU > 0 || slices.ContainsFunc(b.MemberCPUs, func(c float64) bool { return c > 0 })
}

// Of returns the budget of member i of a cluster that started with n
// members, 0 when unconfined (or i < 0).
func (b CPUBudgets) Of(i, n int) float64 {
	switch {
	case i < 0:
		return 0
	case i < len(b.MemberCPUs) && b.MemberCPUs[i] > 0:
		return b.MemberCPUs[i]
	case b.MemberCPU > 0:
		return b.MemberCPU
	case b.ClusterCPU > 0 && n > 0:
		return b.ClusterCPU / float64(n)
	}
	return 0
}

// memberLimits holds each member's cgroup (nil for an unconfined one):
// every process of member i (its server, its proxies) joins limit i.
type memberLimits struct {
	budgets CPUBudgets
	initial int    // members the cluster started with, for ClusterCPU
	prefix  string // cgroup names: prefix-m<i>
	limits  []*cpuLimit
}

// grow creates member i's cgroup; members are added in index order.
func (l *memberLimits) grow(i int) error {
	var lim *cpuLimit
	if cores := l.budgets.Of(i, l.initial); cores > 0 {
		var err error
		if lim, err = newCPULimit(fmt.Sprintf("%s-m%d", l.prefix, i), cores); err != nil {
			return err
		}
	}
	l.limits = append(l.limits, lim)
	return nil
}

// confine moves process pid into member i's cgroup. A member without one,
// and i < 0, go back to where the process was before ConfineSelf, if it
// was called: they share the host, not the clients' budget.
func (l *memberLimits) confine(i, pid int) error {
	if i < 0 || i >= len(l.limits) || l.limits[i] == nil {
		if home := clientHome.Load(); home != nil {
			return joinCgroup(*home, pid)
		}
		return nil
	}
	return l.limits[i].add(pid)
}

// confineProxies moves process pid, which hosts member i's proxies, into
// member i's cgroup, or to the host's share with ProxiesApart.
func (l *memberLimits) confineProxies(i, pid int) error {
	if l.budgets.ProxiesApart {
		return l.confine(-1, pid)
	}
	return l.confine(i, pid)
}

// clientHome is the cgroup the process left for ConfineSelf's, nil when
// it is not confined.
var clientHome atomic.Pointer[string]

// joinCgroup moves process pid (every thread of it) into cgroup dir.
func joinCgroup(dir string, pid int) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("testbed: cgroup: %w", err)
	}
	return nil
}

// procs is the CPU count to tell member i's Go or Java runtime (0: let
// it find out): both read their cgroup once, at start, before the test
// bed has moved them into member i's.
func (l *memberLimits) procs(i int) int {
	if c := l.cores(i); c > 0 {
		return max(1, int(math.Ceil(c-1e-9)))
	}
	return 0
}

// goEnv returns env with GOMAXPROCS set as Go itself would set it in
// member i's cgroup (the quota rounded up, at least 2).
func (l *memberLimits) goEnv(i int, env []string) []string {
	if n := l.procs(i); n > 0 {
		return append(env, fmt.Sprintf("GOMAXPROCS=%d", max(2, n)))
	}
	return env
}

// proxyEnv is goEnv for the process hosting member i's proxies: a host
// apart from the member's budget finds its CPUs itself.
func (l *memberLimits) proxyEnv(i int, env []string) []string {
	if l.budgets.ProxiesApart {
		return env
	}
	return l.goEnv(i, env)
}

// cores returns member i's budget, 0 when unconfined.
func (l *memberLimits) cores(i int) float64 { return l.budgets.Of(i, l.initial) }

// remove deletes the cgroups; the members' processes must have exited.
func (l *memberLimits) remove() error {
	var errs []error
	for _, lim := range l.limits {
		if lim != nil {
			errs = append(errs, lim.remove())
		}
	}
	l.limits = nil
	return errors.Join(errs...)
}

// CPULimitAvailable returns nil when this machine lets the test bed give
// CPU budgets (a writable cgroup CPU controller), else an error wrapping
// ErrNoCPULimit that says why.
func CPULimitAvailable() error {
	l, err := newCPULimit(fmt.Sprintf("oproute-probe-%d-%d", os.Getpid(), rand.Uint64()), 1)
	if err != nil {
		return err
	}
	l.remove()
	return nil
}

// ConfineSelf confines the calling process, every thread of it, to cores
// CPUs, so that the clients it runs cannot take the CPU that members'
// budgets promise them. Processes it starts afterwards begin in the same
// cgroup until moved: start members with budgets, or they share the
// clients'. release moves the process back to the cgroup it came from and
// removes the new one.
func ConfineSelf(cores float64) (release func() error, err error) {
	home, err := cpuCgroupOf("self")
	if err != nil {
		return nil, err
	}
	// In a container without its own cgroup namespace the path names the
	// host's hierarchy: without it here, release could not move back.
	if _, err := os.Stat(filepath.Join(home, "cgroup.procs")); err != nil {
		return nil, fmt.Errorf("%w: own cgroup: %w", ErrNoCPULimit, err)
	}
	if !clientHome.CompareAndSwap(nil, &home) {
		return nil, errors.New("testbed: ConfineSelf: already confined")
	}
	l, err := newCPULimit(fmt.Sprintf("oproute-client-%d-%d", os.Getpid(), rand.Uint64()), cores)
	if err != nil {
		clientHome.Store(nil)
		return nil, err
	}
	if err := l.add(os.Getpid()); err != nil {
		l.remove()
		clientHome.Store(nil)
		return nil, fmt.Errorf("%w: %w", ErrNoCPULimit, err)
	}
	return func() error {
		if err := joinCgroup(home, os.Getpid()); err != nil {
			return fmt.Errorf("testbed: leave the clients' cgroup: %w", err)
		}
		clientHome.Store(nil)
		return l.remove()
	}, nil
}

// cpuCgroupOf returns the directory of process pid's cgroup ("self": the
// caller's) in the hierarchy that holds the cpu controller (v2's unified
// one, or v1's cpu one), where newCPULimit makes its cgroups.
func cpuCgroupOf(pid string) (string, error) {
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoCPULimit, err)
	}
	v2 := cgroupV2()
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// hierarchy-ID:controllers:path
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if v2 && f[0] == "0" {
			return filepath.Join("/sys/fs/cgroup", f[2]), nil
		}
		if !v2 && slices.Contains(strings.Split(f[1], ","), "cpu") {
			return filepath.Join("/sys/fs/cgroup/cpu", f[2]), nil
		}
	}
	return "", fmt.Errorf("%w: no cpu hierarchy in /proc/%s/cgroup", ErrNoCPULimit, pid)
}

// cgroupV2 reports whether the cpu controller is on cgroup v2's unified
// hierarchy (else v1's cpu hierarchy serves).
func cgroupV2() bool {
	ctrl, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	return err == nil && slices.Contains(strings.Fields(string(ctrl)), "cpu")
}

// cfsPeriodMicros is the CFS bandwidth period. The kernel's default of
// 100 ms lets a member that used its quota early stall for tens of
// milliseconds; 10 ms keeps such stalls to milliseconds.
const cfsPeriodMicros = 10000

// cpuLimit confines one process to a share of the CPU through a cgroup.
type cpuLimit struct {
	dir string
	v2  bool
}

// newCPULimit creates a cgroup allowing cores CPUs (cgroup v2's cpu.max
// or v1's cfs quota, whichever this machine has).
func newCPULimit(name string, cores float64) (*cpuLimit, error) {
	quota := int(math.Round(cores * cfsPeriodMicros))
	if quota < 1000 {
		return nil, fmt.Errorf("testbed: %v cores is below the 0.1-core minimum", cores)
	}
	if cgroupV2() {
		l := &cpuLimit{dir: filepath.Join("/sys/fs/cgroup", name), v2: true}
		if err := os.Mkdir(l.dir, 0o755); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoCPULimit, err)
		}
		if err := os.WriteFile(filepath.Join(l.dir, "cpu.max"), []byte(fmt.Sprintf("%d %d", quota, cfsPeriodMicros)), 0o644); err != nil {
			l.remove()
			return nil, fmt.Errorf("%w: %w", ErrNoCPULimit, err)
		}
		return l, nil
	}
	l := &cpuLimit{dir: filepath.Join("/sys/fs/cgroup/cpu", name)}
	if err := os.Mkdir(l.dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCPULimit, err)
	}
	for file, v := range map[string]int{"cpu.cfs_period_us": cfsPeriodMicros, "cpu.cfs_quota_us": quota} {
		if err := os.WriteFile(filepath.Join(l.dir, file), []byte(strconv.Itoa(v)), 0o644); err != nil {
			l.remove()
			return nil, fmt.Errorf("%w: %w", ErrNoCPULimit, err)
		}
	}
	return l, nil
}

// add moves a process (all its threads) into the cgroup.
func (l *cpuLimit) add(pid int) error { return joinCgroup(l.dir, pid) }

// remove deletes the cgroup; its processes must have exited.
func (l *cpuLimit) remove() error {
	if err := os.Remove(l.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("testbed: remove cgroup: %w", err)
	}
	return nil
}
