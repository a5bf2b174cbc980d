package readme

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestEveryOptionDocumented checks that each backend's page in docs/ names
// every exported With… function of the backend's package: an option added
// without its line in the docs fails here.
func TestEveryOptionDocumented(t *testing.T) {
	for _, tc := range []struct{ pkg, doc string }{
		{"../../backends/etcd", "../../docs/etcd.md"},
		{"../../backends/zk", "../../docs/zookeeper.md"},
	} {
		doc, err := os.ReadFile(tc.doc)
		if err != nil {
			t.Fatal(err)
		}
		opts := withFuncs(t, tc.pkg)
		if len(opts) < 5 {
			t.Fatalf("%s: %d With… functions found, the parse is wrong", tc.pkg, len(opts))
		}
		for _, name := range opts {
			if !regexp.MustCompile("`" + name + `\b`).Match(doc) {
				t.Errorf("%s does not document %s.%s", filepath.Base(tc.doc), filepath.Base(tc.pkg), name)
			}
		}
	}
}

// withFuncs returns the exported functions named With… of the package in
// dir (not its tests).
func withFuncs(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.IsExported() && strings.HasPrefix(fn.Name.Name, "With") {
				names = append(names, fn.Name.Name)
			}
		}
	}
	return names
}
