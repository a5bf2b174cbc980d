package kubernetes_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
// the patch's default) and set to hybrid (every client the factory builds
// is routed). Their TLS test dials an etcd over TLS through the factory's
// own client configuration; the health and readiness tests replace the
// client constructor and check the factory's logic around it.
func TestAPIServerPatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and tests a patched copy of k8s.io/apiserver")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git, which applies the patch, is not installed")
	}
	const gobin = "go"
	src := strings.TrimSpace(run(t, ".", nil, gobin, "list", "-m", "-f", "{{.Dir}}", "k8s.io/apiserver"))
	patch, err := filepath.Abs(patchFile)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}

	apiserver := filepath.Join(t.TempDir(), "apiserver")
	if err := os.CopyFS(apiserver, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	run(t, apiserver, nil, "git", "apply", "--verbose", patch)

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
		"-replace=k8s.io/apiserver="+apiserver, "-replace=github.com/oproute/oproute="+root)

	const pkg = "k8s.io/apiserver/pkg/storage/storagebackend/factory"
	// The variable reaches the routed constructor: with a policy the router
	// does not know, the TLS test's client fails with the patch's error.
	t.Run("unknown policy", func(t *testing.T) {
		cmd := exec.CommandContext(t.Context(), gobin, "test", "-count=1", "-run", "TestTLSConnection", pkg)
		cmd.Dir, cmd.Env = mod, append(os.Environ(), "OPROUTE_ETCD_POLICY=no_such_policy")
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
			out := run(t, mod, []string{"OPROUTE_ETCD_POLICY=" + policy}, gobin, "test", "-count=1", "-v", pkg)
			passed := strings.Count(out, "--- PASS")
			if passed == 0 || strings.Contains(out, "--- FAIL") {
				t.Fatalf("the factory's tests on the patched copy: %d passed\n%s", passed, out)
			}
			t.Logf("%s: %d tests and subtests passed", pkg, passed)
		})
	}
}

// run runs a command in dir with env added and returns its output; a
// failure ends the test with the output.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}
