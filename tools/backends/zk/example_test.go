package zk_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/tools/testbed"
)

// Example is the README's ZooKeeper snippet, run against a throw-away
// 3-server ensemble on loopback. It returns its errors rather than
// exiting, so that its deferred Closes always run.
func Example() {
	if err := exampleZK(); err != nil {
		fmt.Println(err)
	}
	// Output: ready
}

func exampleZK() error {
	ensemble, err := testbed.StartZK(context.Background(), testbed.ZKOptions{})
	if err != nil {
		return err
	}
	defer ensemble.Close()
	servers := ensemble.Endpoints()

	// Without WithConnectTimeout, Connect returns at once and connects in
	// the background, as zk.Connect does; with it, it waits until the
	// servers are probed (the leader known), so that the first write goes
	// to the leader.
	conn, events, err := ozk.Connect(servers, 10*time.Second, ozk.WithConnectTimeout(5*time.Second), ozk.WithLogger(quiet{}))
	if err != nil {
		return err
	}
	defer conn.Close()
	go func() {
		for ev := range events { // the primary session's events, as zk.Connect's
			if ev.State == zk.StateExpired {
				log.Print("session expired: its ephemeral nodes are gone")
			}
		}
	}()

	acl := zk.WorldACL(zk.PermAll)
	if _, err := conn.Create("/app", nil, 0, acl); err != nil && err != zk.ErrNodeExists { // to the leader
		return err
	}
	node, err := conn.Create("/app/member-", []byte("ready"), zk.FlagEphemeralSequential, acl) // on the primary session
	if err != nil {
		return err
	}
	data, _, err := conn.Get(node) // sync + read, spread over the healthy servers
	if err != nil {
		return err
	}
	fmt.Println(string(data))
	return nil
}
