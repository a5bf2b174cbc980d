package kubernetes_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	okube "github.com/oproute/oproute/integrations/kubernetes"
)

// New fills only what the caller left zero, with kube-apiserver's values.
func TestAPIServerConfig(t *testing.T) {
	got := okube.APIServerConfig(clientv3.Config{Endpoints: []string{"a:2379"}})
	if got.DialTimeout != 20*time.Second || got.DialKeepAliveTime != 30*time.Second || got.DialKeepAliveTimeout != 10*time.Second {
		t.Errorf("zero config: dial timeout %v, keep-alive %v/%v; want kube-apiserver's 20s, 30s/10s",
			got.DialTimeout, got.DialKeepAliveTime, got.DialKeepAliveTimeout)
	}
	set := clientv3.Config{DialTimeout: time.Second, DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 3 * time.Second}
	if got := okube.APIServerConfig(set); got.DialTimeout != set.DialTimeout || got.DialKeepAliveTime != set.DialKeepAliveTime || got.DialKeepAliveTimeout != set.DialKeepAliveTimeout {
		t.Errorf("set fields changed: %v, %v/%v", got.DialTimeout, got.DialKeepAliveTime, got.DialKeepAliveTimeout)
	}
}
