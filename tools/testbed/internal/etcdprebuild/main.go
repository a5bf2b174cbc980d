// Command etcdprebuild builds the etcd server releases of the
// compatibility matrix (testbed.EtcdCompatVersions) and discards them:
// test.sh runs it in the background at the lowest priority, so that the
// module and build caches hold them when TestServerVersions builds them
// (from empty caches each build is minutes of one core). Being a plain
// build of the test bed, it also compiles what the member binary needs.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/oproute/oproute/tools/testbed"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	code := 0
	for _, v := range testbed.EtcdCompatVersions {
		if _, err := testbed.EtcdServer(ctx, v); err != nil {
			fmt.Fprintln(os.Stderr, "etcdprebuild:", err)
			code = 1
		}
	}
	os.Exit(code)
}
