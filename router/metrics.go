package router

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// ReadLatencyBuckets are the read and write latency histograms' buckets:
// 0.25 ms to about 4 s, doubling.
var ReadLatencyBuckets = prometheus.ExponentialBuckets(0.00025, 2, 15)

// Collector returns the router's Prometheus metrics as a collector for the
// caller to register (the router touches no global registry; wrap the
// registerer with prometheus.WrapRegistererWith to tell clients apart).
// Read and write latencies are observed from the first call on;
// everything else is read from Stats when scraped. The same collector is
// returned each time.
//
//	oproute_operations_total{member,class,outcome}  counter  outcome: ok (answered), error, gave_up
//	oproute_read_latency_seconds{member}             histogram of answered reads
//	oproute_write_latency_seconds{member}            histogram of answered writes
//	oproute_build_info{version,go_version}           gauge    1: the SDK's module version and the Go release that built it
//	oproute_member_up{member}                        gauge    1 while reachable
//	oproute_member_ejected{member}                   gauge    1 while reachable but out of the read pool
//	oproute_member_leader{member}                    gauge    1 for the member writes go to
//	oproute_ejections_total{member}                  counter
//	oproute_readmissions_total{member}               counter
//	oproute_probe_rtt_seconds{member}                gauge    probe round trip, EWMA
//	oproute_probe_failures_total{member}             counter
//	oproute_leader_changes_total                     counter
//	oproute_fallbacks_total                          counter  leader-bound operations sent round robin (leader unknown)
//	oproute_hedged_reads_total{result}               counter  hedges sent (result="sent") and those that answered first ("won")
func (r *Router) Collector() prometheus.Collector {
	r.collectorOnce.Do(func() {
		vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "oproute_read_latency_seconds",
			Help:    "Latency of reads the member answered, as the client saw it.",
			Buckets: ReadLatencyBuckets,
		}, []string{"member"})
		writes := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "oproute_write_latency_seconds",
			Help:    "Latency of writes the member answered, as the client saw it.",
			Buckets: ReadLatencyBuckets,
		}, []string{"member"})
		r.mu.Lock()
		r.latency, r.writeLatency = vec, writes
		ro := *r.roster()
		ro.hist = make([]prometheus.Observer, len(ro.members))
		ro.writeHist = make([]prometheus.Observer, len(ro.members))
		for i, m := range ro.members {
			ro.hist[i] = vec.WithLabelValues(m.ID)
			ro.writeHist[i] = writes.WithLabelValues(m.ID)
		}
		r.ros.Store(&ro)
		r.mu.Unlock()
		member := []string{"member"}
		version, goVersion := buildInfo()
		r.collector = &collector{r: r, latency: vec, writeLatency: writes,
			buildInfo: prometheus.MustNewConstMetric(
				prometheus.NewDesc("oproute_build_info", "1, labelled with the oproute SDK's module version and the Go release that built it.", nil,
					prometheus.Labels{"version": version, "go_version": goVersion}),
				prometheus.GaugeValue, 1),
			ops:           prometheus.NewDesc("oproute_operations_total", "Operations routed to a member, by class and outcome.", []string{"member", "class", "outcome"}, nil),
			up:            prometheus.NewDesc("oproute_member_up", "1 while the member is reachable (answers probes and serves).", member, nil),
			ejected:       prometheus.NewDesc("oproute_member_ejected", "1 while the member is reachable but out of the read pool.", member, nil),
			leader:        prometheus.NewDesc("oproute_member_leader", "1 for the member writes are sent to.", member, nil),
			ejections:     prometheus.NewDesc("oproute_ejections_total", "Ejections of the member from the read pool.", member, nil),
			readmissions:  prometheus.NewDesc("oproute_readmissions_total", "Returns of the member to the read pool after an ejection.", member, nil),
			probeRTT:      prometheus.NewDesc("oproute_probe_rtt_seconds", "The member's probe round trip (EWMA).", member, nil),
			probeFailures: prometheus.NewDesc("oproute_probe_failures_total", "Failed probes of the member.", member, nil),
			leaderChanges: prometheus.NewDesc("oproute_leader_changes_total", "Moves of the known leader from one member to another.", nil, nil),
			fallbacks:     prometheus.NewDesc("oproute_fallbacks_total", "Leader-bound operations sent round robin because the leader was unknown.", nil, nil),
			hedges:        prometheus.NewDesc("oproute_hedged_reads_total", "Hedged reads: second copies sent, those that answered first, and those due but refused by the budget.", []string{"result"}, nil),
		}
	})
	return r.collector
}

type collector struct {
	r                     *Router
	latency, writeLatency *prometheus.HistogramVec
	buildInfo             prometheus.Metric

	ops, up, ejected, leader, ejections, readmissions, probeRTT, probeFailures, leaderChanges, fallbacks, hedges *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.ops, c.up, c.ejected, c.leader, c.ejections, c.readmissions, c.probeRTT, c.probeFailures, c.leaderChanges, c.fallbacks, c.hedges} {
		ch <- d
	}
	ch <- c.buildInfo.Desc()
	c.latency.Describe(ch)
	c.writeLatency.Describe(ch)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.r.Stats()
	gauge := func(d *prometheus.Desc, v bool, member string) {
		x := 0.0
		if v {
			x = 1
		}
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, x, member)
	}
	for _, m := range st.Members {
		if m.Retired {
			continue
		}
		id := m.Member.ID
		for op := range numOps {
			class := Op(op).String()
			ch <- prometheus.MustNewConstMetric(c.ops, prometheus.CounterValue, float64(m.OK[op]), id, class, "ok")
			ch <- prometheus.MustNewConstMetric(c.ops, prometheus.CounterValue, float64(m.Errors[op]), id, class, "error")
			ch <- prometheus.MustNewConstMetric(c.ops, prometheus.CounterValue, float64(m.GaveUp[op]), id, class, "gave_up")
		}
		gauge(c.up, m.Reachable, id)
		gauge(c.ejected, m.Ejected, id)
		gauge(c.leader, m.Leader, id)
		ch <- prometheus.MustNewConstMetric(c.ejections, prometheus.CounterValue, float64(m.Ejections), id)
		ch <- prometheus.MustNewConstMetric(c.readmissions, prometheus.CounterValue, float64(m.Readmissions), id)
		ch <- prometheus.MustNewConstMetric(c.probeRTT, prometheus.GaugeValue, m.ProbeRTT.Seconds(), id)
		ch <- prometheus.MustNewConstMetric(c.probeFailures, prometheus.CounterValue, float64(m.ProbeFailures), id)
	}
	ch <- prometheus.MustNewConstMetric(c.leaderChanges, prometheus.CounterValue, float64(st.LeaderChanges))
	ch <- prometheus.MustNewConstMetric(c.fallbacks, prometheus.CounterValue, float64(st.Fallbacks))
	ch <- prometheus.MustNewConstMetric(c.hedges, prometheus.CounterValue, float64(st.Hedges.Sent), "sent")
	ch <- prometheus.MustNewConstMetric(c.hedges, prometheus.CounterValue, float64(st.Hedges.Won), "won")
	ch <- prometheus.MustNewConstMetric(c.hedges, prometheus.CounterValue, float64(st.Hedges.Throttled), "throttled")
	ch <- c.buildInfo
	c.latency.Collect(ch)
	c.writeLatency.Collect(ch)
}

// sdkModule is the module whose version oproute_build_info reports.
const sdkModule = "github.com/oproute/oproute"

// buildInfo returns the SDK's module version as the binary records it
// ("(devel)" when the SDK is the main module, as in its own tests;
// "unknown" without build information) and the Go release.
func buildInfo() (version, goVersion string) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown", runtime.Version()
	}
	if bi.Main.Path == sdkModule {
		return bi.Main.Version, bi.GoVersion
	}
	for _, d := range bi.Deps {
		if d.Path == sdkModule {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version, bi.GoVersion
			}
			return d.Version, bi.GoVersion
		}
	}
	return "unknown", bi.GoVersion
}
