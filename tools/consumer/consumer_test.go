// Package consumer builds the SDK as a service outside this repository
// would: from a module proxy, at a version, with nothing of the tools.
package consumer

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"

	"github.com/oproute/oproute/internal/testutil"
)

// sdk is the SDK at this clone's HEAD, under a version that sorts below
// every release: what the test packs and gets.
var sdk = module.Version{Path: "github.com/oproute/oproute", Version: "v0.0.0-tree"}

// heavy are the module paths a service must not get with the SDK: etcd's
// server, the test bed's plotting and progress bar, this repository's
// tools and Kubernetes modules.
var heavy = []string{
	"go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/tests", "gonum.org/v1/plot", "github.com/schollz/progressbar",
	"github.com/oproute/oproute/tools", "github.com/oproute/oproute/integrations", "k8s.io/",
}

// TestSDKModuleIsLean: the SDK's go.mod requires none of the heavy
// modules, directly or indirectly.
func TestSDKModuleIsLean(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("go.mod", b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Module.Mod.Path != sdk.Path {
		t.Fatalf("../../go.mod is %s's, want the SDK's", f.Module.Mod.Path)
	}
	for _, r := range f.Require {
		if isHeavy(r.Mod.Path) {
			t.Errorf("the SDK's go.mod requires %s", r.Mod)
		}
	}
	if len(f.Replace) > 0 {
		t.Errorf("the SDK's go.mod replaces %v: a consumer would not see it", f.Replace)
	}
}

// TestOutsideConsumer packs the SDK at HEAD into a file-based module proxy,
// as a release would be served, and in a fresh module outside the repository
// and any workspace gets it, builds the README's two programs and lists
// its module graph: no heavy module in it.
func TestOutsideConsumer(t *testing.T) {
	if testing.Short() {
		testutil.Skip(t, "the quick tier: builds a module from the module proxy")
	}
	// Its builds load both cores for half a minute: beside a property
	// that times a degraded member's ejection under load they would starve
	// the router's probes. A streak's run 7 failed so, most likely: the
	// member not ejected within 2 s, every member's probes failing, and
	// this test taking 57 s where it takes 25, a sign the two overlapped.
	testutil.HoldCores(t)
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	proxy := t.TempDir()
	dir := filepath.Join(proxy, sdk.Path, "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	zf, err := os.Create(filepath.Join(dir, sdk.Version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	// From git, as a release is made: the committed tree, not files other
	// tests make and remove meanwhile (internal/readme's snippets).
	if err := zip.CreateFromVCS(zf, sdk, "../..", "HEAD", ""); err != nil {
		zf.Close()
		t.Fatalf("packing the SDK: %v", err)
	}
	if err := zf.Close(); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(map[string]any{"Version": sdk.Version, "Time": time.Now().UTC().Format(time.RFC3339)})
	for name, b := range map[string][]byte{"list": []byte(sdk.Version + "\n"), sdk.Version + ".mod": gomod, sdk.Version + ".info": info} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	programs, err := testutil.READMEPrograms("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(programs) < 2 {
		t.Fatalf("%d programs in README.md, want the etcd and ZooKeeper ones", len(programs))
	}
	mod := t.TempDir()
	for i, p := range programs {
		d := filepath.Join(mod, "cmd", string(rune('a'+i)))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "main.go"), p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module example.com/service\n\ngo 1.26.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A module cache of the test's own, so that the tree packed under one
	// version is never taken from an earlier run's; the machine's cache
	// serves the other modules as a file proxy would, and the module
	// proxy what it lacks. -trimpath: the build cache keys an untrimmed
	// package by its directory, in that new cache each run, and every
	// dependency was compiled again (31 s alone; 11 s with it, warm).
	cache := goenv(t, gobin, "GOMODCACHE")
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod -modcacherw -trimpath", "GOMODCACHE="+t.TempDir(),
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(cache, "cache", "download"))+","+goenv(t, gobin, "GOPROXY"),
		"GONOSUMDB="+sdk.Path, "GOPRIVATE=")
	run := func(args ...string) string {
		cmd := exec.Command(gobin, args...)
		cmd.Dir, cmd.Env = mod, env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, errb.Bytes())
		}
		return out.String()
	}
	run("get", sdk.Path+"@"+sdk.Version)
	run("mod", "tidy")
	run("build", "./...")
	graph := run("list", "-m", "all")
	if !strings.Contains(graph, sdk.Path+" "+sdk.Version) {
		t.Fatalf("the module graph lacks %s:\n%s", sdk, graph)
	}
	n := 0
	for line := range strings.Lines(graph) {
		n++
		if path, _, _ := strings.Cut(strings.TrimSpace(line), " "); isHeavy(path) {
			t.Errorf("a service that imports the SDK gets %s", strings.TrimSpace(line))
		}
	}
	t.Logf("the README's programs built from %s at %s; %d modules in the graph", sdk.Path, sdk.Version, n)
}

func isHeavy(path string) bool {
	for _, h := range heavy {
		if path == h || strings.HasPrefix(path, strings.TrimSuffix(h, "/")+"/") || strings.HasSuffix(h, "/") && strings.HasPrefix(path, h) {
			return true
		}
	}
	return false
}

func goenv(t *testing.T, gobin, name string) string {
	out, err := exec.Command(gobin, "env", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
