package etcd_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oproute/oproute/backends/etcd"
)

// Example is the README's etcd program. It is compiled here, not run: the
// tools module runs it against a throw-away cluster on loopback
// (tools/backends/etcd).
func Example() {
	endpoints := []string{"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"}
	// WithConnectTimeout: wait until the leader is known (clientv3.New returns at once).
	cli, err := etcd.New(clientv3.Config{Endpoints: endpoints}, etcd.WithConnectTimeout(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	if _, err := cli.Put(ctx, "greeting", "hello"); err != nil { // to the leader
		log.Fatal(err)
	}
	resp, err := cli.Get(ctx, "greeting") // linearizable, spread over the healthy read pool
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(resp.Kvs[0].Value))
	fmt.Println(cli.Stats().Leader) // where writes go now
}
