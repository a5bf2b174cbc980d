package testbed

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/mod/semver"

	"github.com/oproute/oproute/internal/testutil"
)

// EtcdServer returns the path of an etcd server of version, a release of
// go.etcd.io/etcd/server/v3 ("v3.5.36"), built from the module proxy once
// per process, for EtcdOptions.Server: the test bed's own members are the
// server/v3 its module requires, in its own binary. It runs from memory
// where it can, as the member binary does, and leaves nothing on disk.
func EtcdServer(ctx context.Context, version string) (string, error) {
	if !semver.IsValid(version) || semver.Major(version) != "v3" || semver.Prerelease(version) != "" {
		return "", fmt.Errorf("testbed: etcd server version %q: want a release of v3, as v3.5.36", version)
	}
	serverBuilds.mu.Lock()
	defer serverBuilds.mu.Unlock()
	if path, ok := serverBuilds.paths[version]; ok {
		return path, nil
	}
	path, err := buildEtcdServer(ctx, version)
	if err != nil {
		return "", err
	}
	if serverBuilds.paths == nil {
		serverBuilds.paths = map[string]string{}
	}
	serverBuilds.paths[version] = path
	return path, nil
}

// EtcdCompatVersions are the etcd server releases besides the test bed's
// own (the server/v3 the tools module requires, v3.7) that the backends are
// held to: the newest patch, on the module proxy, of each minor release
// production clusters run.
var EtcdCompatVersions = []string{"v3.5.36", "v3.6.17"}

// EtcdServerT is EtcdServer for a test: in the quick tier it skips, and a
// failed build fails t.
func EtcdServerT(t testing.TB, version string) string {
	t.Helper()
	if testing.Short() {
		testutil.Skip(t, "the quick tier: builds an etcd server from the module proxy")
	}
	ctx, cancel := context.WithTimeout(context.Background(), memberBuildTimeout)
	defer cancel()
	path, err := EtcdServer(ctx, version)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

var serverBuilds struct {
	mu    sync.Mutex
	paths map[string]string
}

// etcdServerMain is the etcd server's own main: its module's go.mod has
// replace directives, which go install of a version refuses, so the build
// is of a module of its own that requires it.
const etcdServerMain = `package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
`

func buildEtcdServer(ctx context.Context, version string) (string, error) {
	sweepMemberBinaries()
	// Named by this process's ID, as every test-bed directory is, so that
	// the leftover check and the sweep know it.
	src, err := os.MkdirTemp("", fmt.Sprintf("oproute-etcdserver-%d-", os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("testbed: %w", err)
	}
	defer os.RemoveAll(src)
	gomod := fmt.Sprintf("module oproute.test/etcdserver\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n", version)
	for name, body := range map[string]string{"go.mod": gomod, "main.go": etcdServerMain} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			return "", fmt.Errorf("testbed: %w", err)
		}
	}
	// Named as the member binary is, so that the sweep finds it if the
	// process ends before it is in memory.
	out := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-etcd-%s", memberBinaryPrefix, os.Getpid(), version))
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", out, "."}} {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = src
		// Outside this repository's workspace, with the server's own
		// requirements; on one core, as a busy neighbour is, beside tests
		// that time milliseconds (a cold build takes minutes).
		cmd.Env = append(os.Environ(), "GOWORK=off", strings.TrimSpace("GOFLAGS="+os.Getenv("GOFLAGS")+" -mod=mod -p=1"), "GOMAXPROCS=1")
		if b, err := cmd.CombinedOutput(); err != nil {
			os.Remove(out)
			return "", fmt.Errorf("testbed: building etcd %s (go %s): %w\n%s", version, strings.Join(args, " "), err, b)
		}
	}
	return inMemory(out, "oproute-etcd-"+version)
}

// EtcdServerVersion returns what the etcd server binary at path says its
// version is ("3.5.36").
func EtcdServerVersion(path string) (string, error) {
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("testbed: %s --version: %w", path, err)
	}
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "etcd Version: "); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("testbed: %s --version says no version: %q", path, out)
}

// serverEnv is the environment of an etcd server binary: the test bed's,
// without the ETCD_ variables the server would read as flags (the test
// bed's own members read none).
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	return env
}

// serverFlags are the etcd server's flags for member spec s: what
// runMember sets in embed.Config for the test bed's own members.
func serverFlags(s memberSpec) []string {
	flags := []string{
		"--name", s.Name, "--data-dir", s.Dir,
		"--listen-client-urls", s.ListenClient, "--advertise-client-urls", s.AdvertiseClient,
		"--listen-peer-urls", s.ListenPeer, "--initial-advertise-peer-urls", s.AdvertisePeer,
		"--initial-cluster", s.InitialCluster, "--initial-cluster-state", s.ClusterState,
		"--initial-cluster-token", s.Token,
		"--unsafe-no-fsync", "--logger", "zap", "--log-level", "error", "--log-outputs", "stderr",
	}
	if s.CertFile != "" {
		flags = append(flags, "--cert-file", s.CertFile, "--key-file", s.KeyFile)
	}
	if os.Getenv("OPROUTE_TESTBED_PPROF") != "" {
		flags = append(flags, "--enable-pprof")
	}
	return flags
}

// awaitServerHealth marks p ready once the etcd server it runs says it is
// healthy on its own client URL (it has a leader), as the test bed's own
// members print the ready line once their server is ready; it gives up
// when p exits.
func awaitServerHealth(p *process, client *http.Client, clientURL string) {
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.exited:
				return
			case <-tick.C:
			}
			resp, err := client.Get(clientURL + "/health")
			if err != nil {
				continue
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`) {
				p.markReady()
				return
			}
		}
	}()
}
