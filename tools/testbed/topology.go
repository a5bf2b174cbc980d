package testbed

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// Topology places the client and the members in zones and says how long a
// byte takes between zones, one way.
type Topology struct {
	// ClientZone is where the client runs.
	ClientZone string `json:"client_zone"`
	// Zones holds one zone per member, in member order; its length is the
	// cluster size.
	Zones []string `json:"zones"`
	// SameZone is the one-way delay within a zone. Default 0.25 ms.
	SameZone Duration `json:"same_zone"`
	// CrossZone is the one-way delay between zones. Default 1 ms.
	CrossZone Duration `json:"cross_zone"`
	// Jitter is the uniform jitter as a fraction of the delay. Default 0.1.
	Jitter float64 `json:"jitter"`
	// Leader is the member moved to leadership after start-up, so runs are
	// comparable; -1 leaves whoever won the first election. Default 0.
	Leader int `json:"leader"`
}

// Duration is a time.Duration that reads "1ms" or a number of nanoseconds
// from JSON.
type Duration time.Duration

// UnmarshalJSON accepts "250us" or 250000.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		*d = Duration(v)
		return err
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration %s: want \"1ms\" or nanoseconds", b)
	}
	*d = Duration(n)
	return nil
}

// MarshalJSON writes "1ms".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// DefaultTopology is the paper's Table I scaled to loopback: zone a holds the
// client, the leader (member 0) and one follower; zone b one follower; with
// five members zone c holds the other two.
func DefaultTopology(members int) Topology {
	zones := []string{"a", "a", "b", "c", "c"}
	if members < len(zones) {
		zones = zones[:members]
	}
	for len(zones) < members {
		zones = append(zones, "c")
	}
	return Topology{ClientZone: "a", Zones: zones, SameZone: Duration(250 * time.Microsecond), CrossZone: Duration(time.Millisecond), Jitter: 0.1}
}

// ThreeZoneTopology puts each of three members in a zone of its own: the
// client and follower m0 in zone a, the leader m1 in zone b, follower m2 in
// zone c. The median member is a far one, and the leader is one zone away.
func ThreeZoneTopology() Topology {
	t := DefaultTopology(3)
	t.Zones, t.Leader = []string{"a", "b", "c"}, 1
	return t
}

// FlatTopology has no injected delay at all.
func FlatTopology(members int) Topology {
	t := DefaultTopology(members)
	t.SameZone, t.CrossZone, t.Jitter = 0, 0, 0
	return t
}

// LoadTopology reads a Topology from a JSON file; missing delays take the
// defaults.
func LoadTopology(path string) (Topology, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Topology{}, fmt.Errorf("topology: %w", err)
	}
	t := Topology{SameZone: -1, CrossZone: -1, Jitter: -1}
	if err := json.Unmarshal(b, &t); err != nil {
		return Topology{}, fmt.Errorf("topology %s: %w", path, err)
	}
	def := DefaultTopology(len(t.Zones))
	if t.SameZone < 0 {
		t.SameZone = def.SameZone
	}
	if t.CrossZone < 0 {
		t.CrossZone = def.CrossZone
	}
	if t.Jitter < 0 {
		t.Jitter = def.Jitter
	}
	return t, t.validate()
}

func (t Topology) validate() error {
	if n := len(t.Zones); n < 1 || n > 9 {
		return fmt.Errorf("topology: %d members, want 1..9", n)
	}
	if t.SameZone < 0 || t.CrossZone < 0 || t.Jitter < 0 || t.Jitter > 1 {
		return fmt.Errorf("topology: negative delay or jitter outside [0,1]")
	}
	if t.Leader >= len(t.Zones) {
		return fmt.Errorf("topology: leader %d outside %d members", t.Leader, len(t.Zones))
	}
	return nil
}

// oneWay returns the delay between two zones.
func (t Topology) oneWay(a, b string) time.Duration {
	if a == b {
		return time.Duration(t.SameZone)
	}
	return time.Duration(t.CrossZone)
}

// startDefaults gives a cluster's options their defaults (three members in
// DefaultTopology, 90 s to start) and checks the topology.
func startDefaults(topo *Topology, startTimeout *time.Duration) error {
	if topo.Zones == nil {
		*topo = DefaultTopology(3)
	}
	if *startTimeout == 0 {
		*startTimeout = 90 * time.Second
	}
	return topo.validate()
}
