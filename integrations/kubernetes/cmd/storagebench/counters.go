package main

import (
	"bytes"
	"context"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/oproute/oproute/tools/bench"
	"github.com/oproute/oproute/tools/testbed"
)

// The counts an apiserverClient reads from its servers at each end of a
// trial's window (bench.CountingClient): their processes' CPU time, and
// from their own /metrics the latency sums and counts of the workload's
// requests, as the server saw them (apiserver_request_duration_seconds:
// the whole request; etcd_request_duration_seconds: its etcd call).
const (
	apiserverCPU   = "apiserver_cpu_s"
	postSum        = "apiserver_post_pods_s"
	postCount      = "apiserver_post_pods"
	getSum         = "apiserver_get_pods_s"
	getCount       = "apiserver_get_pods"
	etcdCreateSum  = "etcd_create_pods_s"
	etcdCreateCall = "etcd_create_pods"
	etcdGetSum     = "etcd_get_pods_s"
	etcdGetCall    = "etcd_get_pods"
)

// Counters sums its servers' counts; a server that cannot be read leaves
// its counts out of the map, and so out of the trial's record.
func (c *apiserverClient) Counters(ctx context.Context) map[string]float64 {
	var mu sync.Mutex
	out := map[string]float64{}
	failed := map[string]bool{}
	add := func(name string, v float64, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		if !ok {
			failed[name] = true
			return
		}
		out[name] += v
	}
	var wg sync.WaitGroup
	for _, s := range c.servers {
		wg.Go(func() {
			cpu, err := testbed.ProcessCPU(s.PID())
			add(apiserverCPU, cpu.Seconds(), err == nil)
			text, err := s.Metrics(ctx)
			families := map[string]*dto.MetricFamily{}
			if err == nil {
				parser := expfmt.NewTextParser(model.UTF8Validation)
				families, err = parser.TextToMetricFamilies(bytes.NewReader(text))
			}
			for _, h := range []struct {
				family, sum, count string
				labels             map[string]string
			}{
				{"apiserver_request_duration_seconds", postSum, postCount, map[string]string{"verb": "POST", "resource": "pods"}},
				{"apiserver_request_duration_seconds", getSum, getCount, map[string]string{"verb": "GET", "resource": "pods"}},
				{"etcd_request_duration_seconds", etcdCreateSum, etcdCreateCall, map[string]string{"operation": "create", "resource": "pods"}},
				{"etcd_request_duration_seconds", etcdGetSum, etcdGetCall, map[string]string{"operation": "get", "resource": "pods"}},
			} {
				sum, count, ok := histogram(families[h.family], h.labels)
				add(h.sum, sum, err == nil && ok)
				add(h.count, count, err == nil && ok)
			}
		})
	}
	wg.Wait()
	for name := range failed {
		delete(out, name)
	}
	return out
}

// histogram sums the sample sums and counts of f's series whose labels
// include want.
func histogram(f *dto.MetricFamily, want map[string]string) (sum, count float64, ok bool) {
	if f == nil {
		return 0, 0, false
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if h := m.GetHistogram(); match && h != nil {
			sum += h.GetSampleSum()
			count += float64(h.GetSampleCount())
			ok = true
		}
	}
	return sum, count, ok
}

// The servers' view in the tables: their CPU, and the mean latency of the
// workload's requests by their own histograms (whose buckets, from 5 ms,
// are too coarse at the test bed's latencies for a median).
var apiserverMetrics = []bench.Metric{
	{Name: "kube-apiserver CPU (cores)", Decimals: 2, Get: func(r bench.Result) float64 { return r.Extra[apiserverCPU] / r.WindowS }},
	meanMetric("kube-apiserver POST mean (ms)", postSum, postCount),
	meanMetric("kube-apiserver GET mean (ms)", getSum, getCount),
	meanMetric("its etcd create mean (ms)", etcdCreateSum, etcdCreateCall),
	meanMetric("its etcd get mean (ms)", etcdGetSum, etcdGetCall),
}

func meanMetric(name, sum, count string) bench.Metric {
	return bench.Metric{Name: name, Decimals: 2, Get: func(r bench.Result) float64 { return 1000 * r.Extra[sum] / r.Extra[count] }}
}
