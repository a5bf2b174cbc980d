// Command etcd-quickstart starts a 3-member etcd cluster on the test bed
// (zones a, a, b on loopback), sends 200 writes and 800 linearizable reads
// through a routed client, and prints where they went, by the router's
// counters and by each member's own /metrics.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

func main() {
	policy := flag.String("policy", router.Hybrid, "routing policy: "+fmt.Sprint(router.Policies()))
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	log.Print("starting a 3-member etcd cluster on 127.0.0.1 …")
	cluster, err := testbed.StartEtcd(ctx, testbed.EtcdOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	cli, err := etcd.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()},
		etcd.WithPolicy(*policy), etcd.WithConnectTimeout(5*time.Second)) // wait for the leader
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	before := serverCounts(ctx, cluster)
	for i := range 1000 {
		key := fmt.Sprintf("quickstart/%d", i%50)
		if i%5 == 0 {
			_, err = cli.Put(ctx, key, "value")
		} else {
			_, err = cli.Get(ctx, key)
		}
		if err != nil {
			log.Fatal(err)
		}
	}
	after := serverCounts(ctx, cluster)

	st := cli.Stats()
	fmt.Printf("policy %s, leader %s\n\n", st.Policy, st.Leader)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "member\tzone\trouted writes\trouted reads\tPuts served\tRanges served\tread EWMA\t")
	for i, m := range st.Members {
		fmt.Fprintf(w, "m%d%s\t%s\t%d\t%d\t%d\t%d\t%v\t\n", i, leaderMark(m.Leader), cluster.Topology().Zones[i],
			m.Ops[router.Write], m.Reads(),
			after[i]["etcdserverpb.KV/Put"]-before[i]["etcdserverpb.KV/Put"],
			after[i]["etcdserverpb.KV/Range"]-before[i]["etcdserverpb.KV/Range"],
			m.ReadLatency.Round(10*time.Microsecond))
	}
	w.Flush()
}

func leaderMark(leader bool) string {
	if leader {
		return " (leader)"
	}
	return ""
}

func serverCounts(ctx context.Context, c *testbed.EtcdCluster) []map[string]uint64 {
	out := make([]map[string]uint64, c.Size())
	for i := range out {
		n, err := c.GRPCCounts(ctx, i)
		if err != nil {
			log.Fatal(err)
		}
		out[i] = n
	}
	return out
}
