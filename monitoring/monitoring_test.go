package monitoring

import (
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/oproute/oproute/internal/testutil"
)

// TestAlertRules runs promtool on the rules and their unit tests. CI
// installs promtool (Debian's prometheus package); elsewhere the test is
// skipped, saying so, when promtool is missing.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testutil.Skip(t, "promtool not found (apt-get install prometheus); the rules are not checked")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestEveryAlertIsTested: each alert of alerts.yaml has a case in
// alerts_test.yaml.
func TestEveryAlertIsTested(t *testing.T) {
	rules, tests := read(t, "alerts.yaml"), read(t, "alerts_test.yaml")
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\w+)`).FindAllStringSubmatch(rules, -1)
	if len(alerts) < 5 {
		t.Fatalf("%d alerts found in alerts.yaml", len(alerts))
	}
	for _, a := range alerts {
		if !strings.Contains(tests, "alertname: "+a[1]+"\n") {
			t.Errorf("alert %s has no case in alerts_test.yaml", a[1])
		}
	}
}

// TestQueriesNameExportedMetrics: every metric an alert or a dashboard
// query names is one the collectors export, and the dashboard shows every
// metric they export.
func TestQueriesNameExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	metric := regexp.MustCompile(`oproute_[a-z0-9_]+`)
	var exprs []string
	for _, m := range regexp.MustCompile(`(?m)^\s*expr: (.+)$`).FindAllStringSubmatch(read(t, "alerts.yaml"), -1) {
		exprs = append(exprs, m[1])
	}
	alertExprs := len(exprs)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct{ Definition string }
		}
	}
	if err := json.Unmarshal([]byte(read(t, "dashboard.json")), &dash); err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
			for _, name := range metric.FindAllString(q.Expr, -1) {
				shown[family(name, exported)] = true
			}
		}
	}
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	for i, e := range exprs {
		names := metric.FindAllString(e, -1)
		if len(names) == 0 && e != "" {
			t.Errorf("query %q names no oproute metric", e)
		}
		for _, name := range names {
			if _, ok := exported[name]; !ok {
				where := "dashboard.json"
				if i < alertExprs {
					where = "alerts.yaml"
				}
				t.Errorf("%s: %s is not a metric the collectors export", where, name)
			}
		}
	}
	for name, family := range exported {
		if name == family && !shown[name] {
			t.Errorf("the dashboard shows nothing of %s", name)
		}
	}
}

// exportedMetrics reads the metric names the collectors declare
// (prometheus.NewDesc, and histograms with their series' suffixes),
// mapping each series name to its family.
func exportedMetrics(t *testing.T) map[string]string {
	t.Helper()
	desc := regexp.MustCompile(`NewDesc\(\s*"(oproute_[a-z0-9_]+)"`)
	hist := regexp.MustCompile(`HistogramOpts\{[^}]*Name:\s*"(oproute_[a-z0-9_]+)"`)
	out := map[string]string{}
	for _, dir := range []string{"../router", "../backends/etcd", "../backends/zk"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src := read(t, f)
			for _, m := range desc.FindAllStringSubmatch(src, -1) {
				out[m[1]] = m[1]
			}
			for _, m := range hist.FindAllStringSubmatch(src, -1) {
				for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
					out[m[1]+suffix] = m[1]
				}
			}
		}
	}
	if out["oproute_operations_total"] == "" || out["oproute_read_latency_seconds_bucket"] == "" {
		t.Fatalf("exported metrics %v: the source scan is wrong", slices.Sorted(maps.Keys(out)))
	}
	return out
}

func family(name string, exported map[string]string) string {
	if f, ok := exported[name]; ok {
		return f
	}
	return name
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
