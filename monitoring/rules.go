package monitoring

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"text/template"
)

// RulesConfig adapts the alerting rules to how the clients' metrics are
// scraped, as etcd's own monitoring mixin does (etcd_selector,
// clusterLabel): which series are the clients', and which label tells
// the etcd or ZooKeeper clusters they talk to apart.
type RulesConfig struct {
	// Selector is PromQL label matchers, without braces, that pick the
	// clients' series (`job=~"api|worker"`); empty picks every oproute
	// series. It may not hold "#" or ": " (the rules are YAML).
	Selector string
	// ClusterLabel is the label the fleet is aggregated by, besides the
	// member: clients that share its value talk to one cluster. Default
	// "job": a scrape job's clients share a cluster. Instance labels
	// (instance, pod) are aggregated away, so that a bad member alerts
	// once, not once per client.
	ClusterLabel string
	// MemberShare is the share of a cluster's clients that must see a
	// member out of the read pool, or unreachable, for it to be the
	// member's fault; below it, the clients that see it alone are told
	// of at info severity (their own network path). Default 0.25.
	MemberShare float64
	// RunbookURL is where each alert's runbook_url points, its name
	// lowercased as the anchor. Default DefaultRunbookURL.
	RunbookURL string
}

// DefaultRunbookURL is the runbook the rules link to by default.
const DefaultRunbookURL = "https://github.com/oproute/oproute/blob/main/docs/runbook.md"

// ErrInvalidRulesConfig: a RulesConfig the rules cannot be made from.
var ErrInvalidRulesConfig = errors.New("monitoring: invalid rules config")

//go:embed rules.yaml.tmpl
var rulesTemplate string

var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// Rules returns Prometheus recording and alerting rules for oproute
// clients (a rule file): monitoring/alerts.yaml is Rules of the zero
// RulesConfig, that is of the defaults.
func Rules(cfg RulesConfig) ([]byte, error) {
	if cfg.ClusterLabel == "" {
		cfg.ClusterLabel = "job"
	}
	if cfg.MemberShare == 0 {
		cfg.MemberShare = 0.25
	}
	if cfg.RunbookURL == "" {
		cfg.RunbookURL = DefaultRunbookURL
	}
	switch {
	case !labelName.MatchString(cfg.ClusterLabel):
		return nil, fmt.Errorf("%w: cluster label %q is not a label name", ErrInvalidRulesConfig, cfg.ClusterLabel)
	case cfg.ClusterLabel == "member" || cfg.ClusterLabel == "__name__":
		return nil, fmt.Errorf("%w: cluster label %q is the rules' own", ErrInvalidRulesConfig, cfg.ClusterLabel)
	case !(cfg.MemberShare > 0 && cfg.MemberShare <= 1):
		return nil, fmt.Errorf("%w: member share %v, want (0, 1]", ErrInvalidRulesConfig, cfg.MemberShare)
	case strings.ContainsAny(cfg.Selector, "{}#\n") || strings.Contains(cfg.Selector, ": "):
		// The rules are YAML plain scalars: a # would start a comment, a
		// ": " a mapping.
		return nil, fmt.Errorf("%w: selector %q: matchers only, without braces, # or \": \"", ErrInvalidRulesConfig, cfg.Selector)
	case strings.ContainsAny(cfg.RunbookURL, "\"\\\n"):
		return nil, fmt.Errorf("%w: runbook URL %q", ErrInvalidRulesConfig, cfg.RunbookURL)
	}
	cfg.Selector = strings.TrimSpace(cfg.Selector)
	sel := cfg.Selector
	t, err := template.New("rules").Delims("[[", "]]").Funcs(template.FuncMap{
		// m is the selector with extra matchers, in braces.
		"m": func(extra ...string) string {
			ms := extra
			if sel != "" {
				ms = append([]string{sel}, extra...)
			}
			if len(ms) == 0 {
				return ""
			}
			return "{" + strings.Join(ms, ", ") + "}"
		},
		"anchor": func(alert string) string { return cfg.RunbookURL + "#" + strings.ToLower(alert) },
	}).Parse(rulesTemplate)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, struct {
		RulesConfig
		Share string // MemberShare as PromQL reads it
	}{cfg, fmt.Sprint(cfg.MemberShare)}); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
