package testbed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNoCPULimit: the machine offers no writable cgroup CPU controller, so
// EtcdOptions.MemberCPU cannot be honoured.
var ErrNoCPULimit = errors.New("testbed: no writable cgroup cpu controller")

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
	quota := int(cores * cfsPeriodMicros)
	if quota < 1000 {
		return nil, fmt.Errorf("testbed: %v cores is below the 0.1-core minimum", cores)
	}
	if ctrl, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(string(ctrl), "cpu") {
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
func (l *cpuLimit) add(pid int) error {
	if err := os.WriteFile(filepath.Join(l.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("testbed: cgroup: %w", err)
	}
	return nil
}

// remove deletes the cgroup; its processes must have exited.
func (l *cpuLimit) remove() { os.Remove(l.dir) }
