package testbed

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on Linux.
const clockTicks = 100

// ProcessCPU returns the user+system CPU time process pid has used, read
// from /proc/<pid>/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("testbed: cpu of %d: %w", pid, err)
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("testbed: cpu of %d: short stat", pid)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("testbed: cpu of %d: bad stat", pid)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// CPUTime returns the CPU time the member's current processes have used:
// its server process and, when they run apart from it, its proxies (0 for
// one that is not running).
func (s *server) CPUTime() time.Duration { return cpuOf(s.PID()) + s.ProxyCPUTime() }

// ProxyCPUTime returns the CPU time the process hosting the member's
// proxies has used when it runs apart from the server process (always for
// ZooKeeper; for etcd with CPUBudgets.ProxiesApart), else 0.
func (s *server) ProxyCPUTime() time.Duration { return cpuOf(s.ProxyPID()) }

// cpuOf is ProcessCPU, 0 for pid 0 or a process that ended.
func cpuOf(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	d, _ := ProcessCPU(pid)
	return d
}

// CPUTimes returns the CPU time each member's current processes have used
// (CPUTime) and, of that, what its proxies apart from its server process
// have (ProxyCPUTime).
func (c *cluster) CPUTimes() (members, proxies []time.Duration) {
	c.nodesMu.Lock() // not netMu: a network change holds it for its broadcast
	nodes := slices.Clone(c.nodes)
	c.nodesMu.Unlock()
	members, proxies = make([]time.Duration, len(nodes)), make([]time.Duration, len(nodes))
	for i, n := range nodes {
		proxies[i] = n.ProxyCPUTime()
		members[i] = cpuOf(n.PID()) + proxies[i]
	}
	return members, proxies
}

// ProxiesApart reports whether the members' proxies run in processes of
// their own, whose CPU CPUTimes tells apart: for ZooKeeper always (but
// with Reconfig, which has no proxies), for etcd with
// CPUBudgets.ProxiesApart.
func (c *cluster) ProxiesApart() bool { return c.apartHosts }
