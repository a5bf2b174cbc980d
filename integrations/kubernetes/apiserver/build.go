// Package apiserver builds kube-apiserver from Kubernetes' released
// sources with the routed-etcd patch applied to k8s.io/apiserver
// (../patches), for the test bed: Build resolves k8s.io/kubernetes at
// KubernetesVersion and its staging modules from the module proxy,
// substitutes the patched k8s.io/apiserver and this repository's SDK, and
// builds cmd/kube-apiserver.
package apiserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// KubernetesVersion is the release Build builds; the patch targets its
// k8s.io/apiserver (StagingVersion).
const (
	KubernetesVersion = "v1.37.2"
	StagingVersion    = "v0.37.2"
)

// main is kube-apiserver's own (k8s.io/kubernetes/cmd/kube-apiserver):
// k8s.io/kubernetes replaces its staging modules by directories, which go
// install of a version refuses, so the build is of a module of its own.
const main = `package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
`

// Options say where Build finds what it patches and keeps what it makes.
type Options struct {
	// Patch is the patch file for k8s.io/apiserver.
	Patch string
	// SDK is the directory of this repository's SDK module (its root),
	// which the patched k8s.io/apiserver imports.
	SDK string
	// Dir keeps the patched sources, the build's module and the binary,
	// named by what they were made from, so that a second Build with the
	// same inputs returns the binary at once. Default: the user's cache
	// directory.
	Dir string
	// Log, if set, receives each go command's output when it ends.
	Log func(format string, args ...any)
}

// Build returns the path of a kube-apiserver binary of KubernetesVersion
// with opts.Patch applied to its k8s.io/apiserver and the SDK at opts.SDK.
// The binary is kept in opts.Dir under a name derived from the patch, the
// SDK's sources and the Go version, and reused while they are unchanged.
// The first build compiles Kubernetes and takes minutes.
func Build(ctx context.Context, opts Options) (string, error) {
	if opts.Patch == "" || opts.SDK == "" {
		return "", errors.New("apiserver: Build needs the patch and the SDK's directory")
	}
	if opts.Dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("apiserver: %w", err)
		}
		opts.Dir = filepath.Join(cache, "oproute", "kube-apiserver")
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	// Absolute: git apply and the build's go.mod run elsewhere.
	for _, p := range []*string{&opts.Patch, &opts.SDK, &opts.Dir} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return "", fmt.Errorf("apiserver: %w", err)
		}
		*p = abs
	}
	key, err := inputsKey(ctx, opts)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return "", fmt.Errorf("apiserver: %w", err)
	}
	// One build of a key at a time, across processes: a second waits for
	// the first's binary instead of removing its work directory.
	unlock, err := lockFile(ctx, filepath.Join(opts.Dir, KubernetesVersion+"-"+key+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	work := filepath.Join(opts.Dir, KubernetesVersion+"-"+key)
	bin := filepath.Join(work, "kube-apiserver")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	// A partial directory from a build that did not finish goes first.
	if err := os.RemoveAll(work); err != nil {
		return "", fmt.Errorf("apiserver: %w", err)
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return "", fmt.Errorf("apiserver: %w", err)
	}
	if err := build(ctx, opts, work, bin); err != nil {
		os.RemoveAll(work)
		return "", err
	}
	return bin, nil
}

func build(ctx context.Context, opts Options, work, bin string) error {
	goCmd := func(dir string, args ...string) ([]byte, error) {
		cmd := command(ctx, dir, "go", args...)
		// Outside any workspace, with the build's own requirements.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		opts.Log("go %s: %s%s", strings.Join(args, " "), stdout.Bytes(), stderr.Bytes())
		if err != nil {
			return nil, fmt.Errorf("apiserver: go %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
		}
		return stdout.Bytes(), nil
	}

	// The released k8s.io/apiserver, copied and patched.
	out, err := goCmd(work, "mod", "download", "-json", "k8s.io/apiserver@"+StagingVersion, "k8s.io/kubernetes@"+KubernetesVersion)
	if err != nil {
		return err
	}
	dirs := map[string]string{}
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var m struct{ Path, Dir, GoMod, Error string }
		if err := dec.Decode(&m); err != nil {
			return fmt.Errorf("apiserver: go mod download: %w", err)
		}
		if m.Error != "" {
			return fmt.Errorf("apiserver: go mod download %s: %s", m.Path, m.Error)
		}
		dirs[m.Path] = m.Dir
		dirs[m.Path+".mod"] = m.GoMod
	}
	patched := filepath.Join(work, "apiserver")
	if err := os.CopyFS(patched, os.DirFS(dirs["k8s.io/apiserver"])); err != nil {
		return fmt.Errorf("apiserver: %w", err)
	}
	apply := command(ctx, patched, "git", "apply", opts.Patch)
	// Outside any repository: inside a work tree git apply would resolve
	// paths from its top and skip them.
	apply.Env = append(os.Environ(), "GIT_CEILING_DIRECTORIES="+work)
	if b, err := apply.CombinedOutput(); err != nil {
		return fmt.Errorf("apiserver: git apply %s: %w\n%s", opts.Patch, err, b)
	}

	// The build's module: k8s.io/kubernetes at its release, each staging
	// module at the release's version (k8s.io/kubernetes replaces them by
	// its own directories), the patched k8s.io/apiserver and the SDK.
	kmod, err := os.ReadFile(dirs["k8s.io/kubernetes.mod"])
	if err != nil {
		return fmt.Errorf("apiserver: %w", err)
	}
	staging := stagingModules(kmod)
	if len(staging) == 0 {
		return fmt.Errorf("apiserver: k8s.io/kubernetes %s's go.mod replaces no staging module", KubernetesVersion)
	}
	mod := filepath.Join(work, "build")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		return fmt.Errorf("apiserver: %w", err)
	}
	if err := os.WriteFile(filepath.Join(mod, "main.go"), []byte(main), 0o644); err != nil {
		return fmt.Errorf("apiserver: %w", err)
	}
	if _, err := goCmd(mod, "mod", "init", "oproute.test/kube-apiserver"); err != nil {
		return err
	}
	edits := []string{"mod", "edit", "-require=k8s.io/kubernetes@" + KubernetesVersion, "-replace=github.com/oproute/oproute=" + opts.SDK}
	for _, m := range staging {
		if m == "k8s.io/apiserver" {
			edits = append(edits, "-replace="+m+"="+patched)
		} else {
			edits = append(edits, "-replace="+m+"="+m+"@"+StagingVersion)
		}
	}
	if _, err := goCmd(mod, edits...); err != nil {
		return err
	}
	if _, err := goCmd(mod, "mod", "tidy"); err != nil {
		return err
	}
	// -trimpath: the build cache's entries do not depend on where the
	// sources are, so that a new work directory reuses the compiled
	// packages. The version is the release's, as its own build stamps it.
	tmp := bin + ".tmp"
	if _, err := goCmd(mod, "build", "-trimpath", "-ldflags", ldflags(), "-o", tmp, "."); err != nil {
		return err
	}
	if err := os.Rename(tmp, bin); err != nil {
		return fmt.Errorf("apiserver: %w", err)
	}
	return nil
}

// ldflags stamps KubernetesVersion where Kubernetes' own build does, so
// that /version and the server's log name the release.
func ldflags() string {
	v := strings.TrimPrefix(KubernetesVersion, "v")
	major, rest, _ := strings.Cut(v, ".")
	minor, _, _ := strings.Cut(rest, ".")
	const pkg = "k8s.io/component-base/version"
	return fmt.Sprintf("-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean", pkg, KubernetesVersion, pkg, major, pkg, minor, pkg)
}

// buildRecipe changes with how build makes the binary (its module, flags
// and main): part of the key, so that a changed recipe builds anew.
const buildRecipe = "2"

// command is name args in dir, in a process group of its own that ctx's
// end kills whole (go build's compilers included), and killed with this
// process.
func command(ctx context.Context, dir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// lockFile holds an exclusive lock on path until the returned func is
// called, waiting for another holder (polling, so that ctx bounds it).
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("apiserver: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("apiserver: waiting for another build of the same inputs: %w", ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// staging returns the modules k8s.io/kubernetes's go.mod replaces by its
// staging directories ("k8s.io/api => ./staging/src/k8s.io/api").
var stagingLine = regexp.MustCompile(`(?m)^\s*(k8s\.io/[A-Za-z0-9._-]+)\s+=>\s+\./staging/src/`)

func stagingModules(gomod []byte) []string {
	var mods []string
	for _, m := range stagingLine.FindAllSubmatch(gomod, -1) {
		mods = append(mods, string(m[1]))
	}
	return mods
}

// inputsKey names a build by what it is made from: the patch, the
// release, the recipe (buildRecipe, main), the SDK's Go sources and
// go.mod, and the Go toolchain and target.
func inputsKey(ctx context.Context, opts Options) (string, error) {
	h := sha256.New()
	patch, err := os.ReadFile(opts.Patch)
	if err != nil {
		return "", fmt.Errorf("apiserver: %w", err)
	}
	h.Write(patch)
	fmt.Fprintf(h, "%s %s %s %s\n", KubernetesVersion, StagingVersion, buildRecipe, main)
	env := exec.CommandContext(ctx, "go", "env", "GOVERSION", "GOOS", "GOARCH", "CGO_ENABLED", "GOEXPERIMENT", "GOAMD64")
	env.Env = append(os.Environ(), "GOWORK=off")
	version, err := env.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			stderr = ee.Stderr
		}
		return "", fmt.Errorf("apiserver: go env: %w: %s", err, stderr)
	}
	h.Write(version)
	fmt.Fprintln(h, runtime.GOOS, runtime.GOARCH)
	err = filepath.WalkDir(opts.SDK, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(opts.SDK, path)
		if d.IsDir() {
			// Nested modules, the repository's metadata and the tests are
			// not what the SDK builds from.
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "tools" || d.Name() == "integrations" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !(strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go")) && rel != "go.mod" && rel != "go.sum" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("apiserver: reading the SDK: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
