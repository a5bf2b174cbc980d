package testbed

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// GRPCCounts returns how many RPCs member i has handled, by method
// ("etcdserverpb.KV/Put"), read from its own /metrics
// (grpc_server_handled_total summed over status codes). The counts are the
// member's own because each member runs in its own process.
func (c *EtcdCluster) GRPCCounts(ctx context.Context, i int) (map[string]uint64, error) {
	n, err := FetchGRPCCounts(ctx, c.http, c.members[i].spec.ListenClient)
	if err != nil {
		return nil, fmt.Errorf("m%d: %w", i, err)
	}
	return n, nil
}

// Served returns what member i served by its own /metrics: Put and
// DeleteRange as writes, Range as reads, Txn apart. A member that is not
// running counts zero.
func (c *EtcdCluster) Served(ctx context.Context, i int) (Served, error) {
	return servedBy(&c.members[i].server, func() (Served, error) {
		n, err := c.GRPCCounts(ctx, i)
		return ServedFromGRPC(n), err
	})
}

// ServedFromGRPC reads Served from a member's gRPC counts (GRPCCounts,
// FetchGRPCCounts).
func ServedFromGRPC(n map[string]uint64) Served {
	return Served{
		Writes: n["etcdserverpb.KV/Put"] + n["etcdserverpb.KV/DeleteRange"],
		Reads:  n["etcdserverpb.KV/Range"],
		Txns:   n["etcdserverpb.KV/Txn"],
	}
}

// GRPCStarted is GRPCCounts for RPCs started (grpc_server_started_total),
// which counts streams still open: where a Watch or LeaseKeepAlive went.
func (c *EtcdCluster) GRPCStarted(ctx context.Context, i int) (map[string]uint64, error) {
	n, err := fetchGRPC(ctx, c.http, c.members[i].spec.ListenClient, "grpc_server_started_total")
	if err != nil {
		return nil, fmt.Errorf("m%d: %w", i, err)
	}
	return n, nil
}

// GRPCReceived is GRPCCounts for messages received on streams
// (grpc_server_msg_received_total): a watch stream's requests, a
// keep-alive stream's renewals.
func (c *EtcdCluster) GRPCReceived(ctx context.Context, i int) (map[string]uint64, error) {
	n, err := fetchGRPC(ctx, c.http, c.members[i].spec.ListenClient, "grpc_server_msg_received_total")
	if err != nil {
		return nil, fmt.Errorf("m%d: %w", i, err)
	}
	return n, nil
}

// FetchGRPCCounts reads an etcd member's /metrics at its client URL and
// returns grpc_server_handled_total summed over status codes, by method
// ("etcdserverpb.KV/Put"). It works for any etcd member whose client URL
// serves /metrics (the default), test bed or not.
func FetchGRPCCounts(ctx context.Context, hc *http.Client, clientURL string) (map[string]uint64, error) {
	return fetchGRPC(ctx, hc, clientURL, "grpc_server_handled_total")
}

// fetchGRPC returns one of the gRPC server counters by method.
func fetchGRPC(ctx context.Context, hc *http.Client, clientURL, family string) (map[string]uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, clientURL+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("testbed: metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("testbed: metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("testbed: parse metrics: %w", err)
	}
	counts := map[string]uint64{}
	fam := families[family]
	if fam == nil {
		return counts, nil
	}
	for _, m := range fam.GetMetric() {
		var service, method string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "grpc_service":
				service = l.GetValue()
			case "grpc_method":
				method = l.GetValue()
			}
		}
		counts[service+"/"+method] += uint64(m.GetCounter().GetValue())
	}
	return counts, nil
}

// ClientConnections returns how many connections clients have opened to
// the member (through its client proxy) since the process hosting its
// proxies started (its own, or its proxy host with ProxiesApart, which
// outlives a kill), 0 when that is not running.
func (m *EtcdMember) ClientConnections() uint64 { return m.clientConnections() }
