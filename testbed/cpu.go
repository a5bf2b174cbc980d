package testbed

import (
	"fmt"
	"os"
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

// CPUTime returns the CPU time the member's current process has used, 0
// when it is not running.
func (m *EtcdMember) CPUTime() time.Duration {
	pid := m.PID()
	if pid == 0 {
		return 0
	}
	d, _ := ProcessCPU(pid)
	return d
}
