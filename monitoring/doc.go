// Package monitoring holds what an operator of oproute clients needs beside
// the metrics: Prometheus alerting rules (alerts.yaml, unit-tested with
// promtool in alerts_test.yaml) and a Grafana dashboard (dashboard.json).
// Its tests check that every query names a metric the clients export.
package monitoring
