package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConfigErrors(t *testing.T) {
	ms := members(3)
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{"no members", Config{}, ErrNoMembers},
		{"duplicate id", Config{Members: []Member{ms[0], ms[0]}}, ErrDuplicateMember},
		{"duplicate addr", Config{Members: []Member{ms[0], {ID: "x", Addr: ms[0].Addr}}}, ErrDuplicateMember},
		{"empty id", Config{Members: []Member{{Addr: "a"}}}, ErrInvalidConfig},
		{"unknown policy", Config{Members: ms, Policy: "random"}, ErrUnknownPolicy},
		{"alpha", Config{Members: ms, Alpha: 2}, ErrInvalidConfig},
		{"eject ratio", Config{Members: ms, EjectRatio: 0.5}, ErrInvalidConfig},
		{"readmit above eject", Config{Members: ms, ReadmitRatio: 3}, ErrInvalidConfig},
		{"probe share", Config{Members: ms, ProbeShare: 0.7}, ErrInvalidConfig},
		{"negative interval", Config{Members: ms, ProbeInterval: -time.Second}, ErrInvalidConfig},
		{"negative temperature", Config{Members: ms, Temperature: -1}, ErrInvalidConfig},
		{"sticky member", Config{Members: ms, StickyMember: "nope"}, ErrUnknownMember},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.cfg)
			if !errors.Is(err, tt.want) {
				if r != nil {
					r.Close()
				}
				t.Fatalf("New: err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestClosed(t *testing.T) {
	tr := newTestRouter(t, Config{})
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := tr.Pick(context.Background(), Write); !errors.Is(err, ErrClosed) {
		t.Fatalf("Pick after Close: %v", err)
	}
}

// Hybrid's variants are hybrid with options, and Stats says which.
func TestStatsReportHybridVariants(t *testing.T) {
	for _, tc := range []struct {
		policy    string
		loadAware bool
		hedge     bool
	}{{Hybrid, false, false}, {HybridP2C, true, false}, {HybridHedge, false, true}} {
		st := newTestRouter(t, Config{Policy: tc.policy}).Stats()
		if st.Policy != Hybrid || st.LoadAware != tc.loadAware || (st.Hedge != nil) != tc.hedge {
			t.Errorf("%s: Stats reports policy %q, load-aware %v, hedge %+v", tc.policy, st.Policy, st.LoadAware, st.Hedge)
		}
		if tc.hedge && (!st.Hedge.Enabled || st.Hedge.Quantile == 0) {
			t.Errorf("%s: hedge %+v, want enabled with its defaults", tc.policy, *st.Hedge)
		}
	}
}
