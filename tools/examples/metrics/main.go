// Command metrics serves a routed etcd client's Prometheus metrics on
// /metrics (127.0.0.1, a free port), degrades one member (+20 ms on its
// links) under a read load, and prints what a user watching would see: the
// event lines as the member leaves the read pool, and the metric lines
// before and after, scraped from the endpoint.
package main

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/tools/testbed"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log.Print("starting a 3-member etcd cluster on 127.0.0.1 …")
	cluster, err := testbed.StartEtcd(ctx, testbed.EtcdOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	events := slog.New(slog.NewTextHandler(os.Stdout, nil))
	cli, err := etcd.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()},
		etcd.WithEventLogger(events), etcd.WithConnectTimeout(5*time.Second)) // wait for the leader
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	// Your registry, not the global one.
	reg := prometheus.NewRegistry()
	reg.MustRegister(cli.Collector())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/metrics"
	fmt.Println("serving", url)

	read := func(n int) {
		for range n {
			if _, err := cli.Get(ctx, "k"); err != nil {
				log.Fatal(err)
			}
		}
	}
	read(600)
	fmt.Println("\n-- healthy --")
	show(url)

	fmt.Println("\n-- m2 degraded (+20 ms each way on its links) --")
	cluster.Degrade(2, 20*time.Millisecond, 2*time.Millisecond)
	deadline := time.Now().Add(30 * time.Second)
	for !cli.Stats().Members[2].Ejected && time.Now().Before(deadline) {
		read(50)
	}
	read(600)
	show(url)
}

// show prints the member lines a dashboard would chart.
func show(url string) {
	resp, err := http.Get(url)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		for _, prefix := range []string{"oproute_member_ejected", "oproute_ejections_total", "oproute_member_leader",
			`oproute_operations_total{class="linearizable_read",member=`, "oproute_read_latency_seconds_sum", "oproute_read_latency_seconds_count"} {
			if strings.HasPrefix(line, prefix) && !strings.Contains(line, `outcome="error"`) && !strings.Contains(line, `outcome="gave_up"`) {
				fmt.Println(line)
			}
		}
	}
}
