package testbed

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

// memberEnv carries a memberSpec to a re-executed member process.
const memberEnv = "OPROUTE_TESTBED_ETCD_MEMBER"

// readyLine is printed by a member process once it serves clients.
const readyLine = "oproute-testbed-member-ready"

type memberSpec struct {
	Name            string `json:"name"`
	Dir             string `json:"dir"`
	ListenClient    string `json:"listen_client"`
	AdvertiseClient string `json:"advertise_client"`
	ListenPeer      string `json:"listen_peer"`
	AdvertisePeer   string `json:"advertise_peer"`
	InitialCluster  string `json:"initial_cluster"`
	ClusterState    string `json:"cluster_state"`
	Token           string `json:"token"`
	CertFile        string `json:"cert_file,omitempty"`
	KeyFile         string `json:"key_file,omitempty"`
}

func init() {
	// A re-executed member never returns to the host program's main.
	if spec := os.Getenv(memberEnv); spec != "" {
		os.Exit(runMember(spec))
	}
}

func runMember(raw string) int {
	var spec memberSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "testbed member: bad spec:", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = spec.Name, spec.Dir
	cfg.Logger, cfg.LogLevel, cfg.LogOutputs = "zap", "error", []string{"stderr"}
	cfg.UnsafeNoFsync = true
	cfg.InitialCluster, cfg.ClusterState, cfg.InitialClusterToken = spec.InitialCluster, spec.ClusterState, spec.Token
	var err error
	parse := func(s string) []url.URL {
		u, perr := url.Parse(s)
		if perr != nil && err == nil {
			err = perr
		}
		return []url.URL{*u}
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = parse(spec.ListenClient), parse(spec.AdvertiseClient)
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = parse(spec.ListenPeer), parse(spec.AdvertisePeer)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testbed member: bad URL:", err)
		return 2
	}
	cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = spec.CertFile, spec.KeyFile
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testbed member: start:", err)
		return 1
	}
	<-e.Server.ReadyNotify()
	fmt.Println(readyLine)

	// Stop on SIGTERM (graceful: etcd hands leadership over first), on the
	// parent closing our stdin (the parent died), or on a server error.
	parentGone := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(parentGone)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case <-parentGone:
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "testbed member:", err)
		e.Close()
		return 1
	}
	e.Close()
	return 0
}
