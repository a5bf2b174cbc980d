// Command oproute-rules writes Prometheus rules for oproute clients to
// standard output, adapted to how their metrics are scraped: which series
// are the clients' (-selector) and which label tells the clusters they
// talk to apart (-cluster-label). Without flags it writes
// monitoring/alerts.yaml.
//
//	go run ./cmd/oproute-rules -selector 'job=~"api|worker"' -cluster-label etcd_cluster > oproute-rules.yaml
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/oproute/oproute/monitoring"
)

func main() {
	var cfg monitoring.RulesConfig
	flag.StringVar(&cfg.Selector, "selector", "", `PromQL label matchers, without braces, that pick the clients' series (e.g. job=~"api|worker"); empty: every oproute series`)
	flag.StringVar(&cfg.ClusterLabel, "cluster-label", "job", "the label that tells the clusters the clients talk to apart")
	flag.Float64Var(&cfg.MemberShare, "member-share", 0.25, "the share of a cluster's clients that must see a member out, for it to be the member's fault")
	flag.StringVar(&cfg.RunbookURL, "runbook-url", monitoring.DefaultRunbookURL, "where the alerts' runbook_url points (the alert's name, lowercased, is the anchor)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "oproute-rules: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	out, err := monitoring.Rules(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "oproute-rules:", err)
		os.Exit(2)
	}
	os.Stdout.Write(out)
}
