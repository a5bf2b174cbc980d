// Package readme checks the front door: the README's Go programs build as
// pasted, and the docs name every option of both backends.
package readme

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/oproute/oproute/internal/testutil"
)

// TestSnippetsBuild vets every complete program (a ```go block starting
// with "package main") in README.md, in a directory of this module that
// the go command's ./... skips (its name starts with "_"), removed after.
func TestSnippetsBuild(t *testing.T) {
	blocks, err := testutil.READMEPrograms("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// Left over by a run that was killed mid-way.
	stale, _ := filepath.Glob("_snippet*")
	for _, dir := range stale {
		os.RemoveAll(dir)
	}
	if len(blocks) < 2 {
		t.Fatalf("%d complete programs in README.md, want the etcd and ZooKeeper ones", len(blocks))
	}
	for i, b := range blocks {
		dir, err := os.MkdirTemp(".", "_snippet")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		if err := os.WriteFile(filepath.Join(dir, "main.go"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("go", "vet", "./"+dir).CombinedOutput()
		if err != nil {
			t.Errorf("README program %d does not build as pasted: %v\n%s", i+1, err, out)
		}
		out, err = exec.Command("gofmt", "-l", dir).Output()
		if err != nil {
			t.Fatalf("gofmt: %v", err)
		}
		if len(out) > 0 {
			t.Errorf("README program %d is not gofmt'd", i+1)
		}
	}
}
