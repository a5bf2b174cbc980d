//go:build !race

package testbed

import (
	"fmt"
	"net/url"
	"os"

	"go.etcd.io/etcd/server/v3/embed"
)

// startMemberServer starts the etcd server of a re-executed member process.
func startMemberServer(spec memberSpec) (memberServer, error) {
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = spec.Name, spec.Dir
	cfg.Logger, cfg.LogLevel, cfg.LogOutputs = "zap", "error", []string{"stderr"}
	cfg.UnsafeNoFsync = true
	cfg.EnablePprof = os.Getenv("OPROUTE_TESTBED_PPROF") != "" // /debug/pprof on the client URL, for profiling runs
	cfg.InitialCluster, cfg.ClusterState, cfg.InitialClusterToken = spec.InitialCluster, spec.ClusterState, spec.Token
	var perr error
	parse := func(s string) []url.URL {
		u, err := url.Parse(s)
		if err != nil {
			perr = err
			return nil
		}
		return []url.URL{*u}
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = parse(spec.ListenClient), parse(spec.AdvertiseClient)
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = parse(spec.ListenPeer), parse(spec.AdvertisePeer)
	if perr != nil {
		return memberServer{}, fmt.Errorf("%w: bad URL: %v", errBadSpec, perr)
	}
	cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = spec.CertFile, spec.KeyFile
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return memberServer{}, fmt.Errorf("start: %w", err)
	}
	return memberServer{ready: e.Server.ReadyNotify(), err: e.Err(), stopped: e.Server.StopNotify(), close: e.Close}, nil
}
