// Package monitoring holds what an operator of oproute clients needs beside
// the metrics: Prometheus rules (Rules, adapted to how the clients are
// scraped as etcd's monitoring mixin is; alerts.yaml is the default,
// unit-tested with promtool in alerts_test.yaml, cmd/oproute-rules writes
// others), the runbook their alerts link (docs/runbook.md) and a Grafana
// dashboard (dashboard.json). Its tests check that every query names a
// metric the clients export.
package monitoring
