package testbed

import (
	"context"
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

	"github.com/oproute/oproute/internal/testutil"
)

// errPortTaken: a member could not bind a port picked for it; another
// process took it between the pick and the bind.
var errPortTaken = errors.New("testbed: port taken")

// errLeaderNotMoved: the topology's leader did not win the elections a
// leader move brought about.
var errLeaderNotMoved = errors.New("testbed: leader not moved")

// retryPortTaken runs start up to three times while it fails because a
// picked port was taken.
func retryPortTaken[C any](start func() (C, error)) (C, error) {
	return retryStart(start, func(err error) bool { return errors.Is(err, errPortTaken) })
}

// retryStart runs start up to three times while it fails with an error
// retryable says a fresh start may not meet; each failure but the last is
// told on stderr, so that none passes unseen.
func retryStart[C any](start func() (C, error), retryable func(error) bool) (C, error) {
	for attempt := 1; ; attempt++ {
		c, err := start()
		if err == nil || !retryable(err) || attempt == 3 {
			return c, err
		}
		fmt.Fprintf(os.Stderr, "testbed: start attempt %d failed, starting afresh: %v\n", attempt, err)
	}
}

// workDir returns dir, or a new temporary directory (own: Close removes it)
// when dir is empty, named by prefix and this process's ID, so that a test
// can tell its own from those of test binaries running beside it.
func workDir(dir, prefix string) (_ string, own bool, err error) {
	if dir != "" {
		return dir, false, nil
	}
	if dir, err = os.MkdirTemp("", fmt.Sprintf("%s%d-", prefix, os.Getpid())); err != nil {
		return "", false, fmt.Errorf("testbed: %w", err)
	}
	return dir, true, nil
}

// memberBinary returns the executable that runs etcd members and proxy
// hosts: this one, unless it is race-instrumented, in which case a plain
// build of etcdmember (the race detector would slow the servers
// several-fold and skew every timing). The build runs once per process
// under its own bound (memberBuildTimeout; a cold build takes minutes on
// two cores), not ctx's deadline, which is a cluster's start timeout: call
// it before that clock starts (StartEtcdT and StartZKT do). A failed build is not kept:
// the next cluster tries again.
//
// OPROUTE_ETCD_MEMBER_BIN, if set, names the executable instead: a build
// without the race detector of a program that imports this package.
func memberBinary(ctx context.Context, dir string) (string, error) {
	if bin := os.Getenv("OPROUTE_ETCD_MEMBER_BIN"); bin != "" {
		return bin, nil
	}
	if !testutil.RaceEnabled {
		// A race-instrumented binary cannot host members
		// (member_server_race.go), and they must not be slowed by it.
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("testbed: %w", err)
		}
		return self, nil
	}
	memberBuild.mu.Lock()
	defer memberBuild.mu.Unlock()
	if memberBuild.path != "" {
		return memberBuild.path, nil
	}
	sweepMemberBinaries()
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), memberBuildTimeout)
	defer cancel()
	out := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d", memberBinaryPrefix, os.Getpid()))
	cmd := exec.CommandContext(bctx, "go", "build", "-race=false", "-o", out, "github.com/oproute/oproute/tools/testbed/internal/etcdmember")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(out)
		return "", fmt.Errorf("testbed: building the member binary: %w\n%s", err, b)
	}
	path, err := inMemory(out, "oproute-etcdmember")
	if err != nil {
		return "", err
	}
	memberBuild.path = path
	return path, nil
}

// memberBuildTimeout bounds the member binary's build.
const memberBuildTimeout = 10 * time.Minute

var memberBuild struct {
	mu   sync.Mutex
	path string // once built
}

// inMemoryFiles are the memory files the paths inMemory returned execute:
// open for the life of the process.
var inMemoryFiles struct {
	mu    sync.Mutex
	files []*os.File
}

// inMemory moves the executable at path into an anonymous memory file
// named name and returns a path that executes it (/proc/<pid>/fd/<n>,
// valid while this process lives): nothing is left on disk when the
// process ends, however it ends.
func inMemory(path, name string) (string, error) {
	fd, err := unix.MemfdCreate(name, 0)
	if err != nil {
		return path, nil // no memfd: run it from disk; the sweep removes it later
	}
	defer os.Remove(path)
	mem := os.NewFile(uintptr(fd), name)
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
	inMemoryFiles.mu.Lock()
	inMemoryFiles.files = append(inMemoryFiles.files, mem) // kept open for the life of the process
	inMemoryFiles.mu.Unlock()
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
		// The process ID, then for an etcd server of another version
		// (EtcdServer) "-etcd-VERSION".
		rest, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(path), memberBinaryPrefix), "-")
		pid, err := strconv.Atoi(rest)
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
