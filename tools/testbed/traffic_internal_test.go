package testbed

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/oproute/oproute/tools/testbed/proxy"
)

// TestTrafficClassified: with the client and m0, m1 in zone a and m2 in
// zone b, a member's client link crosses zones when the member is not in
// the client's zone, and a peer link when its sender is not in the
// member's; an unnamed sender stays in the member's zone.
func TestTrafficClassified(t *testing.T) {
	topo := DefaultTopology(3)
	for _, tc := range []struct {
		name  string
		self  int
		links linkTraffic
		want  Traffic
	}{
		{"same zone", 0, linkTraffic{
			Client: proxy.Bytes{Upstream: 100, Downstream: 1000},
			Peers:  map[int]proxy.Bytes{1: {Upstream: 10, Downstream: 20}, 2: {Upstream: 3, Downstream: 4}},
		}, Traffic{ClientTotal: 1100, PeerTotal: 37, PeerCrossZone: 7}},
		{"other zone", 2, linkTraffic{
			Client: proxy.Bytes{Upstream: 100, Downstream: 1000},
			Peers:  map[int]proxy.Bytes{0: {Upstream: 10, Downstream: 20}, unknownSender: {Upstream: 5}},
		}, Traffic{ClientTotal: 1100, ClientCrossZone: 1100, PeerTotal: 35, PeerCrossZone: 30}},
		{"nothing yet", 1, linkTraffic{}, Traffic{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.links.classify(topo, tc.self); got != tc.want {
				t.Errorf("classify(m%d) = %+v, want %+v", tc.self, got, tc.want)
			}
		})
	}
}

// TestTrafficWire: a host's answer reads back as sent, senders by index,
// and addPeer sums a sender's proxies (ZooKeeper's quorum and election).
func TestTrafficWire(t *testing.T) {
	var sent linkTraffic
	sent.Client = proxy.Bytes{Upstream: 1, Downstream: 2}
	sent.addPeer(2, proxy.Bytes{Upstream: 10, Downstream: 20})
	sent.addPeer(2, proxy.Bytes{Upstream: 1, Downstream: 2})
	sent.addPeer(unknownSender, proxy.Bytes{Downstream: 7})
	b, err := json.Marshal(sent)
	if err != nil {
		t.Fatal(err)
	}
	var got linkTraffic
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := linkTraffic{Client: proxy.Bytes{Upstream: 1, Downstream: 2},
		Peers: map[int]proxy.Bytes{2: {Upstream: 11, Downstream: 22}, unknownSender: {Downstream: 7}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s read back as %+v, want %+v", b, got, want)
	}
}

// TestTrafficSince: a member's counts are subtracted while the same host
// counted them; a restarted host's count is all new, and a member not
// running adds nothing.
func TestTrafficSince(t *testing.T) {
	old, restarted, steady := &process{}, &process{}, &process{}
	tr := func(client, peer uint64) Traffic {
		return Traffic{ClientTotal: client, ClientCrossZone: client / 2, PeerTotal: peer, PeerCrossZone: peer / 2}
	}
	before := TrafficCounts{members: []hostTraffic{
		{steady, tr(100, 1000)},
		{old, tr(50, 500)},
		{old, tr(70, 700)},
	}}
	after := TrafficCounts{members: []hostTraffic{
		{steady, tr(300, 1600)}, // +200, +600
		{restarted, tr(20, 40)}, // counted from zero since its restart
		{},                      // not running
		{steady, tr(8, 16)},     // added since
	}}
	if got, want := after.Since(before), tr(228, 656); got != want {
		t.Errorf("Since = %+v, want %+v", got, want)
	}
	if got, want := after.Total(), tr(328, 1656); got != want {
		t.Errorf("Total = %+v, want %+v", got, want)
	}
	if got := before.Since(before); got != (Traffic{}) {
		t.Errorf("a snapshot since itself = %+v, want nothing", got)
	}
	if got, want := after.Since(TrafficCounts{}), after.Total(); got != want {
		t.Errorf("Since an empty snapshot = %+v, want the total %+v", got, want)
	}
	if got := (Traffic{ClientCrossZone: 3, PeerCrossZone: 4}).CrossZone(); got != 7 {
		t.Errorf("CrossZone = %d, want 7", got)
	}
}
