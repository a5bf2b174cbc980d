package zk_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/oproute/oproute/internal/testutil"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/tools/testbed"
)

func settled(conns ...*ozk.Conn) bool {
	for _, c := range conns {
		if !c.Stats().Settled {
			return false
		}
	}
	return true
}

func proxiedConnections(c *testbed.ZKCluster) uint64 {
	var n uint64
	for i := range c.Size() {
		n += c.ClientConnections(i)
	}
	return n
}

// Idle settled Conns that share no probes (a dialer of their own each)
// open at most 0.5 probe connections per Conn and second, by the servers'
// proxies' counts (12 when every round probes), beside what the rounds a
// Conn spends unsettled cost (one slow probe on a loaded machine unsettles
// it for a round or two); unsettled at most a tenth of the window.
func TestIdleConnsProbeRarely(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	conns := make([]*ozk.Conn, 5)
	for i := range conns {
		dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout(network, addr, timeout)
		}
		conns[i], _ = connect(t, c, ozk.WithDialer(dial))
	}
	testutil.Poll(t, 15*time.Second, "every Conn settled", func() bool { return settled(conns...) })
	before, start := proxiedConnections(c), time.Now()
	// The measured window: one stable interval and its jitter.
	unsettled := testutil.UnsettledShare(12*time.Second, len(conns), func(i int) bool { return settled(conns[i]) })
	rate := float64(proxiedConnections(c)-before) / time.Since(start).Seconds() / float64(len(conns))
	t.Logf("%d idle settled Conns: %.3f connections per Conn and second, by the proxies' counts; unsettled %.1f %% of the window", len(conns), rate, 100*unsettled)
	if allowed := 0.5 + testutil.UnsettledProbeRate*unsettled; rate > allowed {
		t.Fatalf("%.3f connections per Conn and second, want at most %.3f (0.5 settled, and the unsettled share's)", rate, allowed)
	}
	if unsettled > 0.1 {
		t.Fatalf("Conns unsettled %.1f %% of the window on an idle healthy ensemble, want at most 10 %%", 100*unsettled)
	}
}

// A settled Conn follows a new leader at once (its primary session's
// connection to the old one breaks), not at its next stable probe.
func TestSettledConnFollowsNewLeader(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartZKT(t, testbed.ZKOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, _ := connect(t, c)
	testutil.Poll(t, 15*time.Second, "the Conn settled", func() bool { return settled(conn) })
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MoveLeader(ctx, (old+1)%c.Size()); err != nil {
		t.Fatal(err)
	}
	var now int
	testutil.Poll(t, 30*time.Second, "a new leader", func() bool { now, err = c.Leader(ctx); return err == nil && now != old })
	elected := time.Now()
	testutil.Poll(t, 3*time.Second, "the Conn follows the new leader", func() bool { return conn.Stats().Leader == c.Endpoints()[now] })
	t.Logf("the Conn followed the new leader %v after the servers said it leads (stable probe interval 10 s)", time.Since(elected).Round(time.Millisecond))
}
