// Command zk-quickstart starts a 3-server ZooKeeper ensemble on the test bed
// (Debian's zookeeper package; zones a, a, b on loopback), sends 200 writes
// and 800 linearizable reads through a routed client, creates an ephemeral
// node on the session that owns them, and prints where everything went, by
// the router's counters and by each server's own mntr counts.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"text/tabwriter"
	"time"

	"github.com/go-zookeeper/zk"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

type quiet struct{}

func (quiet) Printf(string, ...any) {}

func main() {
	policy := flag.String("policy", router.Hybrid, "routing policy: "+fmt.Sprint(router.Policies()))
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	log.Print("starting a 3-server ZooKeeper ensemble on 127.0.0.1 …")
	ensemble, err := testbed.StartZK(ctx, testbed.ZKOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer ensemble.Close()

	// WithConnectTimeout: wait until the router knows the leader (without
	// it Connect returns at once, as zk.Connect does).
	conn, events, err := ozk.Connect(ensemble.Endpoints(), 10*time.Second, ozk.WithPolicy(*policy), ozk.WithConnectTimeout(10*time.Second), ozk.WithLogger(quiet{}))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	go func() {
		for ev := range events {
			if ev.State == zk.StateExpired {
				log.Print("session expired: make a new Conn")
			}
		}
	}()

	acl := zk.WorldACL(zk.PermAll)
	if _, err := conn.CreateContext(ctx, "/quickstart", nil, 0, acl); err != nil && err != zk.ErrNodeExists {
		log.Fatal(err)
	}
	me, err := conn.CreateContext(ctx, "/quickstart/member-", []byte("here"), zk.FlagEphemeralSequential, acl)
	if err != nil {
		log.Fatal(err)
	}

	before := serverCounts(ctx, ensemble)
	for i := range 1000 {
		path := fmt.Sprintf("/quickstart/k%d", i%50)
		if i%5 == 0 {
			if _, err = conn.SetContext(ctx, path, []byte("value"), -1); err == zk.ErrNoNode {
				_, err = conn.CreateContext(ctx, path, []byte("value"), 0, acl)
			}
		} else if _, _, err = conn.GetContext(ctx, path); err == zk.ErrNoNode {
			err = nil
		}
		if err != nil {
			log.Fatal(err)
		}
	}
	after := serverCounts(ctx, ensemble)

	st := conn.Stats()
	fmt.Printf("policy %s, leader %s; ephemeral %s owned by session %#x (on %s)\n\n", st.Policy, st.Leader, me, conn.SessionID(), conn.Server())
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "server\tzone\trouted writes\trouted reads\tupdates served\treads+syncs served\tread EWMA\t")
	for i, m := range st.Members {
		fmt.Fprintf(w, "z%d%s\t%s\t%d\t%d\t%d\t%d\t%v\t\n", i, leaderMark(m.Leader), ensemble.Topology().Zones[i],
			m.Ops[router.Write], m.Reads(), after[i][0]-before[i][0], after[i][1]-before[i][1], m.ReadLatency.Round(10*time.Microsecond))
	}
	w.Flush()
}

func leaderMark(leader bool) string {
	if leader {
		return " (leader)"
	}
	return ""
}

// serverCounts returns each server's (updates, reads) from mntr.
func serverCounts(ctx context.Context, c *testbed.ZKCluster) [][2]uint64 {
	out := make([][2]uint64, c.Size())
	for i := range out {
		n, err := c.Requests(ctx, i)
		if err != nil {
			log.Fatal(err)
		}
		out[i] = [2]uint64{n.Updates, n.Reads}
	}
	return out
}
