package etcd_test

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/tools/testbed"
)

// Example is the README's etcd snippet, run against a throw-away 3-member
// cluster on loopback (its first member leads). It returns its errors
// rather than exiting, so that its deferred Closes always run.
func Example() {
	if err := exampleEtcd(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// hello
	// true
}

func exampleEtcd() error {
	cluster, err := testbed.StartEtcd(context.Background(), testbed.EtcdOptions{})
	if err != nil {
		return err
	}
	defer cluster.Close()
	endpoints := cluster.Endpoints()

	// New returns at once, as clientv3.New does; WithConnectTimeout waits
	// until the leader is known, so that the first write goes to it.
	cli, err := etcd.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second}, etcd.WithConnectTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	if _, err := cli.Put(ctx, "greeting", "hello"); err != nil { // to the leader
		return err
	}
	resp, err := cli.Get(ctx, "greeting") // linearizable, spread over the healthy read pool
	if err != nil {
		return err
	}
	fmt.Println(string(resp.Kvs[0].Value))
	fmt.Println(cli.Stats().Leader == endpoints[0]) // where writes go now
	return nil
}
