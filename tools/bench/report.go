package bench

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Markdown renders every comparison, one table each, then the dominance
// summaries of the dominance grid's comparisons among them
// (DominanceMarkdown).
func Markdown(comps []*Comparison) string {
	var b strings.Builder
	for i, c := range comps {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(c.Markdown())
	}
	if d := DominanceMarkdown(comps); d != "" {
		b.WriteString("\n" + d)
	}
	return b.String()
}

// Results flattens the comparisons into their trial records.
func Results(comps []*Comparison) []Result {
	var out []Result
	for _, c := range comps {
		for _, p := range c.Policies {
			out = append(out, c.Trials[p]...)
		}
	}
	return out
}

// ResultsFile is results.json: the run that wrote it (nil when unknown)
// and every trial's record. Files written before it had a Meta hold the
// records alone, a JSON array, which LoadRun still reads.
type ResultsFile struct {
	Meta    *Meta    `json:"meta,omitempty"`
	Results []Result `json:"results"`
}

// WriteFiles writes tables.md, results.json (with meta, which may be nil),
// results.csv and the figures into dir, creating it.
func WriteFiles(dir string, comps []*Comparison, header string, meta *Meta) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tables.md"), []byte(header+"\n"+Markdown(comps)), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	results := Results(comps)
	for i := range results {
		results[i].Extra = finite(results[i].Extra)
	}
	js, err := json.MarshalIndent(ResultsFile{Meta: meta, Results: results}, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := writeCSV(filepath.Join(dir, "results.csv"), results); err != nil {
		return err
	}
	return WriteFigures(dir, comps)
}

// finite drops NaN and infinite values, which JSON cannot encode.
func finite(m map[string]float64) map[string]float64 {
	if m == nil {
		return nil
	}
	out := make(map[string]float64, len(m))
	for k, v := range m {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			out[k] = v
		}
	}
	return out
}

func writeCSV(path string, results []Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	w := csv.NewWriter(f)
	w.Write([]string{"scenario", "variant", "backend", "policy", "trial", "workers",
		"read_p50_ms", "read_p90_ms", "read_p99_ms", "read_p999_ms",
		"write_p50_ms", "write_p90_ms", "write_p99_ms", "write_p999_ms",
		"throughput_ops", "reads", "writes", "errors", "reads_by_member", "writes_by_member",
		"server_reads_by_member", "server_writes_by_member", "client_cpu_cores", "server_cpu_cores", "leader_changed", "extra", "cpu_mode", "topology",
		"client_bytes", "client_cross_zone_bytes", "peer_bytes", "peer_cross_zone_bytes"})
	f64 := func(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) }
	list := func(xs []uint64) string {
		parts := make([]string, len(xs))
		for i, x := range xs {
			parts[i] = strconv.FormatUint(x, 10)
		}
		return strings.Join(parts, ";")
	}
	for _, r := range results {
		extra, _ := json.Marshal(r.Extra)
		traffic := make([]string, 4) // empty when unknown
		if t := r.Traffic; t != nil {
			for i, n := range []uint64{t.ClientTotal, t.ClientCrossZone, t.PeerTotal, t.PeerCrossZone} {
				traffic[i] = strconv.FormatUint(n, 10)
			}
		}
		w.Write(append([]string{r.Scenario, r.Variant, r.Backend, r.Policy, strconv.Itoa(r.Trial), strconv.Itoa(r.Workers),
			f64(r.ReadP50ms), f64(r.ReadP90ms), f64(r.ReadP99ms), f64(r.ReadP999ms),
			f64(r.WriteP50ms), f64(r.WriteP90ms), f64(r.WriteP99ms), f64(r.WriteP999ms),
			f64(r.ThroughputOps), strconv.FormatInt(r.Reads, 10), strconv.FormatInt(r.Writes, 10), strconv.FormatInt(r.Errors, 10),
			list(r.ReadsByMember), list(r.WritesByMember), list(r.ServerReadsByMember), list(r.ServerWritesByMember),
			f64(r.ClientCPU), f64(r.ServerCPU), strconv.FormatBool(r.LeaderChanged), string(extra), r.CPUMode, r.Topology}, traffic...))
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return fmt.Errorf("bench: %w", err)
	}
	return f.Close()
}

// LoadComparisons rebuilds the comparisons of a results.json that
// WriteFiles wrote, with the metrics and notes the scenarios have now: the
// tables and figures can be redrawn without running anything again.
// Policies keep the file's order (the run's); the baseline is the
// scenario's when it ran, else the first policy.
func LoadComparisons(path string) ([]*Comparison, error) {
	comps, _, err := LoadRun(path)
	return comps, err
}

// LoadRun is LoadComparisons with the Meta of the run that wrote the
// file: nil for a file written before results.json had one (a JSON array
// of records), which it reads too.
func LoadRun(path string) ([]*Comparison, *Meta, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	var file ResultsFile
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '[' {
		err = json.Unmarshal(data, &file.Results)
	} else {
		err = json.Unmarshal(data, &file)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %s: %w", path, err)
	}
	comps, err := comparisonsOf(file.Results, path)
	return comps, file.Meta, err
}

// comparisonsOf groups the records of the file at path into comparisons.
func comparisonsOf(results []Result, path string) ([]*Comparison, error) {
	defs := scenarioDefs(layoutOf(nil))
	var comps []*Comparison
	// The dominance grid's layouts and CPU modes share scenarios and
	// variants.
	byKey := map[[4]string]*Comparison{}
	for _, r := range results {
		key := [4]string{r.Scenario, r.Variant, r.Topology, r.CPUMode}
		c := byKey[key]
		if c == nil {
			def, ok := defs[r.Scenario]
			if !ok {
				return nil, fmt.Errorf("%w: %q in %s", ErrUnknownScenario, r.Scenario, path)
			}
			c = &Comparison{Scenario: r.Scenario, Variant: r.Variant, Section: def.section, Baseline: def.baseline,
				Metrics: def.metrics(len(r.ReadsByMember)), Trials: map[string][]Result{}, Notes: def.notes, CPU: r.CPUMode, Topology: r.Topology}
			byKey[key] = c
			comps = append(comps, c)
		}
		if _, seen := c.Trials[r.Policy]; !seen {
			c.Policies = append(c.Policies, r.Policy)
		}
		c.Trials[r.Policy] = append(c.Trials[r.Policy], r)
	}
	for _, c := range comps {
		if !slices.Contains(c.Policies, c.Baseline) {
			c.Baseline = c.Policies[0]
		}
	}
	return comps, nil
}
