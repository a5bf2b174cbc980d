package testbed

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oproute/oproute/tools/testbed/proxy"
)

// Traffic is bytes the test bed's proxies forwarded, sorted by whether
// they crossed zones, as a cloud bills them. Only the TCP payload through
// the proxies counts (TLS records included, TCP/IP headers not): the
// client's connections to the members and the members' connections to
// each other, both ways, each byte once, at the proxy of the member
// dialled. The test bed's own control traffic bypasses the proxies.
type Traffic struct {
	// ClientTotal is client↔member bytes; ClientCrossZone those to and
	// from members outside the client's zone.
	ClientTotal     uint64 `json:"client_total"`
	ClientCrossZone uint64 `json:"client_cross_zone"`
	// PeerTotal is member↔member bytes; PeerCrossZone those between
	// members of different zones. A peer connection that names no known
	// sender (the few etcd peer requests without an X-Server-From header)
	// is taken to stay in the dialled member's zone, as its delay does.
	PeerTotal     uint64 `json:"peer_total"`
	PeerCrossZone uint64 `json:"peer_cross_zone"`
}

// CrossZone returns the bytes that crossed zones, client and peer.
func (t Traffic) CrossZone() uint64 { return t.ClientCrossZone + t.PeerCrossZone }

func (t Traffic) plus(u Traffic) Traffic {
	return Traffic{
		ClientTotal:     t.ClientTotal + u.ClientTotal,
		ClientCrossZone: t.ClientCrossZone + u.ClientCrossZone,
		PeerTotal:       t.PeerTotal + u.PeerTotal,
		PeerCrossZone:   t.PeerCrossZone + u.PeerCrossZone,
	}
}

// minus is t−u field by field, floored at zero: one host's counts only
// grow, and should one not, a difference must not wrap around.
func (t Traffic) minus(u Traffic) Traffic {
	sub := func(a, b uint64) uint64 { return a - min(a, b) }
	return Traffic{
		ClientTotal:     sub(t.ClientTotal, u.ClientTotal),
		ClientCrossZone: sub(t.ClientCrossZone, u.ClientCrossZone),
		PeerTotal:       sub(t.PeerTotal, u.PeerTotal),
		PeerCrossZone:   sub(t.PeerCrossZone, u.PeerCrossZone),
	}
}

// TrafficCounts is a snapshot of every member's proxy counters, which
// count from zero when their host process starts (an etcd member's own
// process: on every Restart; a proxy host apart, as a ZooKeeper server's
// always is: once).
// Subtract two with Since.
type TrafficCounts struct {
	members []hostTraffic // in member order
}

// hostTraffic is what one member's proxy host had counted.
type hostTraffic struct {
	host    *process // nil when the member was not running
	traffic Traffic
}

// Total returns the traffic every member's running proxy host has counted
// since it started.
func (c TrafficCounts) Total() Traffic {
	var t Traffic
	for _, m := range c.members {
		t = t.plus(m.traffic)
	}
	return t
}

// Since returns the traffic between before and c, member by member. A
// member whose proxy host restarted in between adds what the new one
// counted, and one not running at c adds nothing: the bytes through a
// host that ended in between are lost with it, so across a restart the
// result is a lower bound.
func (c TrafficCounts) Since(before TrafficCounts) Traffic {
	var t Traffic
	for i, m := range c.members {
		if i < len(before.members) && m.host != nil && before.members[i].host == m.host {
			t = t.plus(m.traffic.minus(before.members[i].traffic))
		} else {
			t = t.plus(m.traffic)
		}
	}
	return t
}

// Traffic returns a snapshot of what every member's proxies have
// forwarded, sorted by zone with the topology in effect. A member whose
// proxy host is not running (an etcd member that is down; a ZooKeeper
// server's proxies outlive its JVM) counts nothing; one whose host does
// not answer fails it, as does a paused etcd member whose proxies are
// frozen with it (unless they run apart).
func (c *cluster) Traffic() (TrafficCounts, error) {
	c.netMu.Lock()
	topo, nodes := c.net.Topo, slices.Clone(c.nodes)
	c.netMu.Unlock()
	// A member being added is in nodes a moment before it has a zone.
	nodes = nodes[:min(len(nodes), len(topo.Zones))]
	counts := TrafficCounts{members: make([]hostTraffic, len(nodes))}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, s := range nodes {
		wg.Go(func() {
			links, host, err := s.linkTraffic()
			switch {
			case errors.Is(err, ErrNotRunning):
			case err != nil:
				errs[i] = err
			default:
				counts.members[i] = hostTraffic{host: host, traffic: links.classify(topo, i)}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return TrafficCounts{}, fmt.Errorf("testbed: traffic: %w", err)
	}
	return counts, nil
}

// Traffic is cluster.Traffic, which a Reconfig ensemble, without proxies,
// cannot count.
func (c *ZKCluster) Traffic() (TrafficCounts, error) {
	if c.opts.Reconfig {
		return TrafficCounts{}, errors.New("testbed: traffic: a Reconfig ensemble has no proxies to count it")
	}
	return c.cluster.Traffic()
}

// unknownSender keys the peer connections whose sender a proxy could not
// name.
const unknownSender = -1

// linkTraffic is a proxy host's answer to the "traffic" query: what one
// member's proxies have forwarded since the host started, by link.
type linkTraffic struct {
	Client proxy.Bytes `json:"client"`
	// Peers is by the sending member's index (unknownSender: not named).
	Peers map[int]proxy.Bytes `json:"peers,omitempty"`
}

// addPeer adds a peer proxy's bytes from sender from.
func (l *linkTraffic) addPeer(from int, n proxy.Bytes) {
	if l.Peers == nil {
		l.Peers = map[int]proxy.Bytes{}
	}
	sum := l.Peers[from]
	sum.Upstream += n.Upstream
	sum.Downstream += n.Downstream
	l.Peers[from] = sum
}

// classify sorts member self's link bytes by zone.
func (l linkTraffic) classify(topo Topology, self int) Traffic {
	zone := topo.Zones[self]
	t := Traffic{ClientTotal: l.Client.Upstream + l.Client.Downstream}
	if zone != topo.ClientZone {
		t.ClientCrossZone = t.ClientTotal
	}
	for from, n := range l.Peers {
		bytes := n.Upstream + n.Downstream
		t.PeerTotal += bytes
		if from >= 0 && from < len(topo.Zones) && topo.Zones[from] != zone {
			t.PeerCrossZone += bytes
		}
	}
	return t
}

// linkTraffic asks the member's proxy host what its proxies have
// forwarded, and returns which host answered.
func (s *server) linkTraffic() (linkTraffic, *process, error) {
	r, host, err := s.askHost(control{Query: "traffic"}, 5*time.Second)
	if err != nil {
		return linkTraffic{}, nil, err
	}
	payload, ok := strings.CutPrefix(r, "traffic ")
	if !ok {
		return linkTraffic{}, nil, fmt.Errorf("%s answered %q", s.name, r)
	}
	var l linkTraffic
	if err := json.Unmarshal([]byte(payload), &l); err != nil {
		return linkTraffic{}, nil, fmt.Errorf("%s: %w", s.name, err)
	}
	return l, host, nil
}
