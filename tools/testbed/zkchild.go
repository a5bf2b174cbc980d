package testbed

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/oproute/oproute/tools/testbed/proxy"
)

// zkProxyEnv carries a zkProxySpec to a re-executed proxy host.
const zkProxyEnv = "OPROUTE_TESTBED_ZK_PROXIES"

// zkProxySpec is the set of proxies in front of one ZooKeeper server: its
// client port, and one listener per peer for each of its quorum and
// election ports (ZooKeeper's peer connections do not name their sender
// before the protocol starts, so each sender gets its own port).
type zkProxySpec struct {
	Index int       `json:"index"`
	Links []zkLink  `json:"links"`
	Net   *netState `json:"net"`
}

type zkLink struct {
	Listen int    `json:"listen"`
	Target string `json:"target"`
	// From is the sending server's index, -1 for the client link.
	From int `json:"from"`
}

func init() {
	if spec := os.Getenv(zkProxyEnv); spec != "" {
		os.Exit(runZKProxies(spec))
	}
}

// runZKProxies hosts one ZooKeeper server's proxies in a process of their
// own, as etcd members host theirs: the JVM cannot, and in the client's
// process they would tax the client.
func runZKProxies(raw string) int {
	spec, net, ok := readSpec[zkProxySpec]("testbed zk proxies", raw)
	if !ok {
		return 2
	}
	var client *proxy.Proxy
	var all []*proxy.Proxy
	peers := map[*proxy.Proxy]int{} // quorum and election proxies → sender
	for _, l := range spec.Links {
		shape := func(string, proxy.Direction) proxy.Link { return net.Load().clientLink(spec.Index) }
		if l.From >= 0 {
			key := strconv.Itoa(l.From)
			shape = func(string, proxy.Direction) proxy.Link { return net.Load().peerLink(spec.Index, key) }
		}
		cfg := proxy.Config{Target: l.Target, Shape: shape}
		if l.From >= 0 {
			cfg.DialRetry = 3 * time.Second
		}
		p, err := proxy.Listen(l.Listen, cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testbed zk proxies:", err)
			return 1
		}
		defer p.Close()
		all = append(all, p)
		if l.From < 0 {
			client = p
		} else {
			peers[p] = l.From
		}
	}
	if client == nil {
		fmt.Fprintln(os.Stderr, "testbed zk proxies: no client link")
		return 2
	}
	fmt.Println(readyLine)
	traffic := func() linkTraffic {
		// One key per proxy: none identifies its connections.
		l := linkTraffic{Client: client.Forwarded()[""]}
		for p, from := range peers {
			l.addPeer(from, p.Forwarded()[""])
		}
		return l
	}
	awaitEnd(serveControl(net, all, client.Accepted, traffic))
	return 0
}
