package kubernetes_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"

	// The factory package and what its own tests import: with them here,
	// this module's go.sum holds every sum the patched copy's tests need.
	_ "k8s.io/apiserver/pkg/storage/etcd3/testing/testingcert"
	_ "k8s.io/apiserver/pkg/storage/etcd3/testserver"
	_ "k8s.io/apiserver/pkg/storage/storagebackend/factory"
)

// patchFile is the patch a kube-apiserver build applies to k8s.io/apiserver
// to choose the routed client (docs/kube-apiserver.md).
const patchFile = "patches/apiserver-v0.37-routed-etcd.patch"

// TestAPIServerPatch applies the patch to a copy of the k8s.io/apiserver
// module this module builds with and runs the storage factory package's
// own tests on the copy: with OPROUTE_ETCD_POLICY unset (the stock client,
// the patch's default), set to hybrid, and set to a policy the router does
// not know. Of those tests only the TLS test builds a client through the
// patched constructor (a routed one, with hybrid: its log lines show it),
// dialling a one-member etcd over TLS with the factory's own client
// configuration; the health and readiness tests replace the constructor
// and check the factory's logic around it.
func TestAPIServerPatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and tests a patched copy of k8s.io/apiserver")
	}
	if _, err := exec.LookPath("git"); err != nil {
		testutil.Skip(t, "git, which applies the patch, is not installed")
	}
	const gobin = "go"
	src := strings.TrimSpace(run(t, ".", nil, gobin, "list", "-m", "-f", "{{.Dir}}", "k8s.io/apiserver"))
	if src == "" {
		t.Fatal("k8s.io/apiserver is not in the module cache: run go mod download in this module")
	}
	patch, err := filepath.Abs(patchFile)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}

	apiserver := patchedCopy(t, src, patch)

	// A module of its own with this module's requirements and sums, the
	// patched copy in place of k8s.io/apiserver.
	mod := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mod, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, mod, nil, gobin, "mod", "edit", "-module=patchtest",
		"-replace=k8s.io/apiserver="+apiserver, "-replace=github.com/oproute/oproute="+root, "-replace=github.com/oproute/oproute/tools="+filepath.Join(root, "tools"))

	const pkg = "k8s.io/apiserver/pkg/storage/storagebackend/factory"
	// TestTimeTravelHealthcheck replaces the constructor, so it never
	// reaches the patch, and it races a sleep against the health check's
	// rate limiter: on the unpatched module it fails about 1 run in 25 with
	// six copies running at once (kubernetes/kubernetes#140526, open).
	const upstreamFlaky = "^TestTimeTravelHealthcheck$"
	// The build first, holding the cores (it loads both), then the three
	// runs of it at once: they mostly wait (on their etcd, on the health
	// checks' timers).
	factoryTest := filepath.Join(t.TempDir(), "factory.test")
	t.Run("build", func(t *testing.T) {
		testutil.HoldCores(t)
		run(t, mod, nil, gobin, "test", "-race", "-c", "-o", factoryTest, pkg)
	})
	if t.Failed() {
		return
	}
	// As go test runs a test binary: in the package's directory.
	pkgDir := filepath.Join(apiserver, "pkg/storage/storagebackend/factory")
	// The variable reaches the routed constructor: with a policy the router
	// does not know, the TLS test's client fails with the patch's error.
	t.Run("unknown policy", func(t *testing.T) {
		t.Parallel()
		cmd := command(t, pkgDir, []string{"OPROUTE_ETCD_POLICY=no_such_policy"}, factoryTest, "-test.count=1", "-test.timeout=5m", "-test.paniconexit0", "-test.run", "TestTLSConnection")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "routed etcd client (OPROUTE_ETCD_POLICY=no_such_policy)") {
			t.Fatalf("with an unknown policy the factory's TLS test should fail in the routed constructor: %v\n%s", err, out)
		}
	})
	for _, policy := range []string{"", "hybrid"} {
		name := "stock"
		if policy != "" {
			name = policy
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out := run(t, pkgDir, []string{"OPROUTE_ETCD_POLICY=" + policy}, factoryTest, "-test.count=1", "-test.timeout=5m", "-test.paniconexit0", "-test.v", "-test.skip", upstreamFlaky)
			passed := strings.Count(out, "--- PASS")
			if passed == 0 || strings.Contains(out, "--- FAIL") {
				t.Fatalf("the factory's tests on the patched copy: %d passed\n%s", passed, out)
			}
			// The routed client logs through the factory's etcd logger
			// with its component named: proof the routed branch ran.
			if routed := strings.Contains(out, `"component":"oproute"`); routed != (policy != "") {
				t.Fatalf("OPROUTE_ETCD_POLICY=%q, yet the routed client's log lines are present: %v\n%s", policy, routed, out)
			}
			t.Logf("%s: %d tests and subtests passed", pkg, passed)
		})
	}
}

// patchedCopy returns a copy of the module at src with patch applied,
// kept in the user's cache directory under a name derived from both and
// reused while they are unchanged: the build cache keys each package by
// its directory, so a copy in a new directory each run recompiled the
// copy's packages under the race detector, where a warm run now only
// links. Runs take turns under a lock on the cache's directory; an entry
// appears whole by a rename and leaves by one (to a trash name, then
// removed), so none is ever seen half made or half removed. Copies of
// other inputs unused for a day are removed.
func patchedCopy(t *testing.T, src, patch string) string {
	t.Helper()
	body, err := os.ReadFile(patch)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", src) // a module cache directory, named by its version
	h.Write(body)
	key := hex.EncodeToString(h.Sum(nil))[:16]
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Logf("no user cache directory (%v): the copy is the test's own", err)
		cache = t.TempDir()
	}
	parent := filepath.Join(cache, "oproute", "apiserver-patched")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(parent, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close() // and the lock with it
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	sweepPatchedCopies(t, parent, key)
	final := filepath.Join(parent, key)
	if _, err := os.Stat(filepath.Join(final, patchedMarker)); err == nil {
		now := time.Now()
		os.Chtimes(final, now, now) // in use: kept from other runs' sweeps
		return final
	}
	tmp, err := os.MkdirTemp(parent, "tmp-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp) // gone once renamed; a failed copy's leftovers otherwise
	copyDir := filepath.Join(tmp, "apiserver")
	if err := os.CopyFS(copyDir, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	// git apply outside a repository: a directory inside a work tree would
	// make it resolve paths from that tree's top and skip them.
	run(t, copyDir, []string{"GIT_CEILING_DIRECTORIES=" + tmp}, "git", "apply", "--verbose", patch)
	if _, err := os.Stat(filepath.Join(copyDir, "pkg/storage/storagebackend/factory/oproute.go")); err != nil {
		t.Fatalf("the patch did not apply: %v", err)
	}
	if err := os.WriteFile(filepath.Join(copyDir, patchedMarker), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(copyDir, final); err != nil {
		t.Fatalf("keeping the patched copy: %v", err)
	}
	return final
}

// patchedMarker is the file a complete patched copy holds.
const patchedMarker = ".oproute-patched"

// sweepPatchedCopies removes from parent, under its lock, copies of other
// inputs unused for a day, and what interrupted runs left: temporary and
// trash directories, and an entry of key without its marker.
func sweepPatchedCopies(t *testing.T, parent, key string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(parent, name)
		switch {
		case !e.IsDir():
			continue
		case strings.HasPrefix(name, "tmp-"), strings.HasPrefix(name, "trash-"):
			os.RemoveAll(path)
			continue
		case name == key:
			if _, err := os.Stat(filepath.Join(path, patchedMarker)); err == nil {
				continue
			}
		default:
			if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < 24*time.Hour {
				continue
			}
		}
		// Out of the way at once, then removed: an interrupted removal
		// leaves only trash.
		trash := filepath.Join(parent, "trash-"+name)
		if os.Rename(path, trash) == nil {
			os.RemoveAll(trash)
		}
	}
}

// run runs a command in dir with env added and returns its output; a
// failure ends the test with the output.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := command(t, dir, env, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// command is name args in dir with env added, outside any go.work, killed
// with the test's context; its children (a test binary with an etcd in
// it) get 10 s to end after that before their output pipes are closed.
func command(t *testing.T, dir string, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "GOWORK=off"), env...)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}
