package zk_test

import (
	"fmt"
	"log"
	"time"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
)

// Example is the README's ZooKeeper program. It is compiled here, not
// run: the tools module runs it against a throw-away ensemble on loopback
// (tools/backends/zk).
func Example() {
	servers := []string{"10.0.0.1:2181", "10.0.0.2:2181", "10.0.0.3:2181"}
	// Without WithConnectTimeout, Connect returns at once and connects in
	// the background, as zk.Connect does; with it, it waits until the
	// servers are probed (the leader known), so that the first write goes
	// to the leader.
	conn, events, err := ozk.Connect(servers, 10*time.Second, ozk.WithConnectTimeout(5*time.Second))
	if err != nil {
		log.Fatal(err)
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
		log.Fatal(err)
	}
	node, err := conn.Create("/app/member-", []byte("ready"), zk.FlagEphemeralSequential, acl) // on the primary session
	if err != nil {
		log.Fatal(err)
	}
	data, _, err := conn.Get(node) // sync + read, spread over the healthy servers
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(data))
}
