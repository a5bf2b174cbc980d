package etcd

import (
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/oproute/oproute/router"
)

// WithServiceConfig gives the client's connection a gRPC service config
// (JSON, as grpc.WithDefaultServiceConfig takes it; see gRPC's
// doc/service_config.md): its method configs (timeouts, retry policies,
// message sizes) and retry throttling apply as on a stock clientv3
// connection given the same config. clientv3's own call options still
// win where they overlap: every call waits for ready whatever
// waitForReady says, message sizes can only be lowered below clientv3's
// limits, and a method timeout bounds one attempt, not the call: clientv3
// sends a call that timed out again, up to Config.MaxUnaryRetries (100 by
// default) times, writes included, so a write can be applied twice.
// Balancing is the router's: a config that names a
// loadBalancingConfig or loadBalancingPolicy, or asks for gRPC's health
// checking (healthCheckConfig; the router probes the members itself), is
// refused with an error wrapping router.ErrInvalidConfig, as is one gRPC
// cannot parse.
//
// A service config set in clientv3.Config.DialOptions
// (grpc.WithDefaultServiceConfig) is replaced by the router's: gRPC gives
// no way to read it back. Stock clientv3 ignores one there too unless
// grpc.WithDisableServiceConfig is also given, since etcd's resolver
// supplies its own (round_robin); give it here instead.
func WithServiceConfig(config string) Option { return func(o *options) { o.serviceConfig = config } }

// routersOwnKeys are the service config's keys that say how calls are
// balanced or whether members are healthy: the router's to set. gRPC
// reads the keys case-insensitively (encoding/json), and so does the check.
var routersOwnKeys = []string{"loadBalancingConfig", "loadBalancingPolicy", "healthCheckConfig"}

// serviceConfig is the service config the client's connection runs with:
// the user's (WithServiceConfig, may be empty) with the router's balancer,
// which finds its router by routerID.
func serviceConfig(user, routerID string) (string, error) {
	var sc map[string]json.RawMessage
	if strings.TrimSpace(user) != "" {
		if err := json.Unmarshal([]byte(user), &sc); err != nil {
			return "", fmt.Errorf("%w: service config: %w", router.ErrInvalidConfig, err)
		}
	}
	if sc == nil { // none given, or JSON null
		sc = map[string]json.RawMessage{}
	}
	for k := range sc {
		for _, own := range routersOwnKeys {
			if strings.EqualFold(k, own) {
				return "", fmt.Errorf("%w: service config sets %q: the router balances the calls and probes the members", router.ErrInvalidConfig, k)
			}
		}
	}
	lb, err := json.Marshal([]map[string]map[string]string{{balancerName: {"router": routerID}}})
	if err != nil {
		return "", err
	}
	sc["loadBalancingConfig"] = lb
	out, err := json.Marshal(sc)
	if err != nil {
		return "", err
	}
	if user != "" {
		// gRPC parses a default service config when the connection is
		// made (grpc.NewClient, which dials nothing): a mistake in it is
		// the caller's, and said before anything starts.
		cc, err := grpc.NewClient("passthrough:///service-config-check",
			grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(string(out)))
		if err != nil {
			return "", fmt.Errorf("%w: %w", router.ErrInvalidConfig, err)
		}
		cc.Close()
	}
	return string(out), nil
}
