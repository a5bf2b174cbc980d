package testbed

import (
	"time"

	"github.com/oproute/oproute/testbed/proxy"
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

// linkExtra is what Degrade and Blackhole add to every link of a member.
type linkExtra struct {
	Delay     time.Duration `json:"delay"`
	Jitter    time.Duration `json:"jitter"`
	Blackhole bool          `json:"blackhole"`
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
	}
}

// peerLink shapes a connection into member self's peer listener from the
// member whose etcd ID (hex) is key; an unknown sender is taken to be in
// self's zone.
func (s *netState) peerLink(self int, key string) proxy.Link {
	base := s.Topo.oneWay(s.Topo.Zones[self], s.Topo.Zones[self])
	x := s.Extra[self]
	delay, jitter, hole := x.Delay, x.Jitter, x.Blackhole
	if j, ok := s.IDs[key]; ok && j < len(s.Extra) {
		base = s.Topo.oneWay(s.Topo.Zones[self], s.Topo.Zones[j])
		delay += s.Extra[j].Delay
		jitter += s.Extra[j].Jitter
		hole = hole || s.Extra[j].Blackhole
	}
	return proxy.Link{Delay: base + delay, Jitter: time.Duration(s.Topo.Jitter*float64(base)) + jitter, Blackhole: hole}
}
