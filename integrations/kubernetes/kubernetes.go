package kubernetes

import (
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"

	"github.com/oproute/oproute/backends/etcd"
)

// What kube-apiserver sets on its etcd client (newETCD3Client in
// k8s.io/apiserver/pkg/storage/storagebackend/factory/etcd3.go, v0.37).
const (
	apiServerDialTimeout      = 20 * time.Second
	apiServerKeepAliveTime    = 30 * time.Second
	apiServerKeepAliveTimeout = 10 * time.Second
)

// New returns a routed client for cfg in the type Kubernetes' storage
// layer takes. Fields cfg leaves zero take kube-apiserver's values
// (package doc); opts are backends/etcd's. Closing the client ends the
// router.
func New(cfg clientv3.Config, opts ...etcd.Option) (*kubernetes.Client, error) {
	cfg = APIServerConfig(cfg)
	// kube-apiserver waits for a ready connection before it serves; New
	// waits for the leader in its place (the caller's opts may change it).
	c, err := etcd.New(cfg, append([]etcd.Option{etcd.WithConnectTimeout(cfg.DialTimeout)}, opts...)...)
	if err != nil {
		return nil, err // already oproute/etcd's, with its sentinels
	}
	return Wrap(c), nil
}

// Wrap returns c as a *kubernetes.Client: the same clientv3 client, so
// closing either ends the router.
func Wrap(c *etcd.Client) *kubernetes.Client {
	kc := &kubernetes.Client{Client: c.Client}
	kc.Kubernetes = kc
	return kc
}

// APIServerConfig returns cfg with the fields kube-apiserver sets filled in
// where cfg leaves them zero: what New does, for a stock client configured
// as kube-apiserver configures its own.
func APIServerConfig(cfg clientv3.Config) clientv3.Config {
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = apiServerDialTimeout
	}
	if cfg.DialKeepAliveTime == 0 {
		cfg.DialKeepAliveTime = apiServerKeepAliveTime
	}
	if cfg.DialKeepAliveTimeout == 0 {
		cfg.DialKeepAliveTimeout = apiServerKeepAliveTimeout
	}
	return cfg
}
