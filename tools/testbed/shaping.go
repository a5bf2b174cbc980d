package testbed

import (
	"time"

	"github.com/oproute/oproute/tools/testbed/proxy"
)

// netState is the emulated network: the topology plus each member's
// injected faults and the map from etcd member IDs to members. The parent
// owns it and sends it to every member process, whose proxies shape by it.
type netState struct {
	Topo  Topology       `json:"topo"`
	Extra []linkExtra    `json:"extra"` // per member
	IDs   map[string]int `json:"ids"`   // hex etcd member ID → index
	// ClientsCut blackholes every client link (peer links keep working).
	ClientsCut bool `json:"clients_cut,omitempty"`
}

// linkExtra is the faults injected on one member's links.
type linkExtra struct {
	// Every link, client and peer (Degrade, Blackhole).
	Delay     time.Duration `json:"delay"`
	Jitter    time.Duration `json:"jitter"`
	Blackhole bool          `json:"blackhole"`
	// Peer links only (DegradePeers, Partition).
	PeerDelay   time.Duration `json:"peer_delay,omitempty"`
	PeerJitter  time.Duration `json:"peer_jitter,omitempty"`
	Partitioned bool          `json:"partitioned,omitempty"`
	// The client link only (ResetClients, ResetClientsAfterReply).
	ResetClients           bool `json:"reset_clients,omitempty"`
	ResetClientsAfterReply bool `json:"reset_clients_after_reply,omitempty"`
}

func (s *netState) clone() *netState {
	c := *s
	c.Extra = append([]linkExtra(nil), s.Extra...)
	c.IDs = make(map[string]int, len(s.IDs))
	for k, v := range s.IDs {
		c.IDs[k] = v
	}
	return &c
}

// clientLink shapes the link between the client and member self.
func (s *netState) clientLink(self int) proxy.Link {
	base := s.Topo.oneWay(s.Topo.ClientZone, s.Topo.Zones[self])
	x := s.Extra[self]
	return proxy.Link{
		Delay:     base + x.Delay,
		Jitter:    time.Duration(s.Topo.Jitter*float64(base)) + x.Jitter,
		Blackhole: x.Blackhole || s.ClientsCut,
		Reset:     x.ResetClients,

		ResetAfterReply: x.ResetClientsAfterReply,
	}
}

// peerLink shapes a connection into member self's peer listener from the
// member whose etcd ID (hex) or ZooKeeper index is key, both ways: it
// carries the faults of both ends. An unknown sender is taken to be in
// self's zone, with no faults of its own.
func (s *netState) peerLink(self int, key string) proxy.Link {
	base := s.Topo.oneWay(s.Topo.Zones[self], s.Topo.Zones[self])
	delay, jitter, hole, stall := s.Extra[self].peer()
	if j, ok := s.IDs[key]; ok && j < len(s.Extra) {
		base = s.Topo.oneWay(s.Topo.Zones[self], s.Topo.Zones[j])
		d, jt, h, st := s.Extra[j].peer()
		delay, jitter, hole, stall = delay+d, jitter+jt, hole || h, stall || st
	}
	return proxy.Link{Delay: base + delay, Jitter: time.Duration(s.Topo.Jitter*float64(base)) + jitter, Blackhole: hole, Stall: stall}
}

// peer returns what x adds to each of the member's peer links. A partition
// stalls them (TCP holds the bytes until it heals) rather than dropping
// bytes from the middle of a stream, which no real network does and which
// leaves ZooKeeper's quorum stream corrupt after the partition heals.
func (x linkExtra) peer() (delay, jitter time.Duration, blackhole, stall bool) {
	return x.Delay + x.PeerDelay, x.Jitter + x.PeerJitter, x.Blackhole, x.Partitioned
}
