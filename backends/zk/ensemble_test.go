package zk_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	ozk "github.com/oproute/oproute/backends/zk"
)

func TestClientAddrs(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		want         []string
		version      string
		err          error
	}{
		{"3.8 as written", "server.3=127.0.0.1:2888:3888:participant;127.0.0.1:2181\nserver.2=127.0.0.1:2889:3889:participant;127.0.0.1:2182\nversion=100000000",
			[]string{"127.0.0.1:2181", "127.0.0.1:2182"}, "100000000", nil},
		{"observer, wildcard and bare port", "server.1=zk1:2888:3888:participant;0.0.0.0:2181\nserver.2=zk2:2888:3888:observer;2181\nserver.3=[::1]:2888:3888;[::]:2181\n",
			[]string{"zk1:2181", "zk2:2181", "[::1]:2181"}, "", nil},
		{"static client port", "server.1=zk1:2888:3888\nversion=1", nil, "", ozk.ErrNoClientAddress},
		{"empty", "", nil, "", ozk.ErrNoClientAddress},
		{"a server's own line binding all addresses", "server.1=0.0.0.0:2888:3888:participant;2181", nil, "", ozk.ErrNoClientAddress},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, version, err := ozk.ClientAddrs([]byte(tc.config))
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" || version != tc.version {
				t.Errorf("addresses (-want +got):\n%s\nversion %q, want %q", diff, version, tc.version)
			}
		})
	}
	for _, bad := range []string{"server.1=zk1:2888:3888;abc", "server.1=zk1:2888:3888;zk1:", "server.1=zk1:2888:3888;[::1]", "server.1=zk1:2888:3888;70000"} {
		if addrs, _, err := ozk.ClientAddrs([]byte(bad)); err == nil {
			t.Errorf("%q: %v, want an error", bad, addrs)
		}
	}
}
