package monitoring

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

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
	rules := read(t, "alerts.yaml")
	// A recorded series (level:metric:operation) stands for the query that
	// records it: a query naming one names the metrics that query reads.
	recorded := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\s*- record: (\S+)\n\s*expr: (.+)$`).FindAllStringSubmatch(rules, -1) {
		recorded[m[1]] = m[2]
	}
	if len(recorded) == 0 {
		t.Fatal("alerts.yaml records nothing: the scan is wrong")
	}
	level := regexp.MustCompile(`\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b`)
	for _, m := range regexp.MustCompile(`(?m)^\s*expr: (.+)$`).FindAllStringSubmatch(rules, -1) {
		exprs = append(exprs, level.ReplaceAllStringFunc(m[1], func(name string) string {
			def, ok := recorded[name]
			if !ok {
				t.Errorf("alerts.yaml: %s is recorded by no rule", name)
			}
			return "(" + def + ")"
		}))
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
		Annotations struct {
			List []struct{ Expr string }
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
	if len(dash.Annotations.List) == 0 {
		t.Error("the dashboard has no annotations (leader changes)")
	}
	for _, a := range dash.Annotations.List {
		exprs = append(exprs, a.Expr)
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

// The rule file shipped is the rules of the default configuration.
func TestAlertsFileIsTheDefaultRules(t *testing.T) {
	got, err := Rules(RulesConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(read(t, "alerts.yaml"), string(got)); diff != "" {
		t.Errorf("alerts.yaml is not Rules(RulesConfig{}) (go run ./cmd/oproute-rules > monitoring/alerts.yaml) (-file +rules):\n%s", diff)
	}
}

// Rules made for another scrape set-up are valid rule files that select
// and aggregate as asked; nonsense configurations are refused.
func TestRulesConfigs(t *testing.T) {
	custom := RulesConfig{Selector: `job=~"api|worker", env="prod"`, ClusterLabel: "etcd_cluster", MemberShare: 0.5, RunbookURL: "https://wiki.example/oproute"}
	out, err := Rules(custom)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`avg by (etcd_cluster, member) (oproute_member_ejected{job=~"api|worker", env="prod"})`,
		`oproute_hedged_reads_total{job=~"api|worker", env="prod", result="throttled"}`,
		`cluster_member:oproute_member_ejected:avg >= 0.5`,
		`runbook_url: "https://wiki.example/oproute#oproutememberoutofreadpool"`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("rules for %+v lack %s", custom, want)
		}
	}
	if strings.Contains(string(out), "by (job") {
		t.Errorf("rules for cluster label etcd_cluster still aggregate by job")
	}
	if promtool, err := exec.LookPath("promtool"); err == nil {
		f := filepath.Join(t.TempDir(), "rules.yaml")
		if err := os.WriteFile(f, out, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
			t.Errorf("promtool check rules on %+v: %v\n%s", custom, err, out)
		}
	}
	for _, bad := range []RulesConfig{
		{ClusterLabel: "etcd-cluster"},
		{ClusterLabel: "member"},
		{MemberShare: 1.5},
		{MemberShare: -0.1},
		{Selector: `{job="api"}`},
		{Selector: `job="a#b"`},
		{Selector: `env="a: b"`},
		{RunbookURL: `https://wiki.example/"x"`},
	} {
		if _, err := Rules(bad); !errors.Is(err, ErrInvalidRulesConfig) {
			t.Errorf("Rules(%+v): %v, want ErrInvalidRulesConfig", bad, err)
		}
	}
}

// Every alert has its section in the runbook, which its runbook_url names.
func TestEveryAlertHasARunbookSection(t *testing.T) {
	runbook := read(t, "../docs/runbook.md")
	for _, a := range regexp.MustCompile(`(?m)^\s*- alert: (\w+)`).FindAllStringSubmatch(read(t, "alerts.yaml"), -1) {
		if !strings.Contains(runbook, "\n## "+a[1]+"\n") {
			t.Errorf("docs/runbook.md has no section ## %s", a[1])
		}
	}
}
