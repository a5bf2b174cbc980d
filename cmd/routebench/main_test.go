package main

import (
	"slices"
	"testing"

	"github.com/oproute/oproute/bench"
)

func TestSetupsFor(t *testing.T) {
	flags := setup{"", auto, auto, false}
	all := []setup{{"", auto, auto, false}, {"", "0", auto, false}, {threeZones, auto, auto, false}, {threeZones, "0", auto, false}}
	for _, tc := range []struct {
		name     string
		names    []string
		set      []string
		external bool
		want     []setup
	}{
		{"the grid", []string{bench.ScenarioDominance}, nil, false, all},
		{"with zk-dominance", []string{bench.ScenarioHealthy, bench.ScenarioZKDominance}, []string{"trials"}, false, all},
		{"not a grid scenario", []string{bench.ScenarioHealthy}, nil, false, []setup{flags}},
		{"all", []string{bench.ScenarioAll}, nil, false, []setup{flags}},
		{"--topology picks one", []string{bench.ScenarioDominance}, []string{"topology"}, false, []setup{flags}},
		{"--member-cpu picks one", []string{bench.ScenarioDominance}, []string{"member-cpu"}, false, []setup{flags}},
		{"--endpoints", []string{bench.ScenarioDominance}, nil, true, []setup{flags}},
	} {
		set := map[string]bool{}
		for _, f := range tc.set {
			set[f] = true
		}
		got, grid := setupsFor(tc.names, set, flags, tc.external)
		if !slices.Equal(got, tc.want) || grid != (len(tc.want) > 1) {
			t.Errorf("%s: %v (grid %v), want %v", tc.name, got, grid, tc.want)
		}
	}
	// --client-cpu holds for the budgets, not for shared cores.
	// --sim spans the layouts only: it has one CPU model.
	sim := setup{"", auto, auto, true}
	if got, grid := setupsFor([]string{bench.ScenarioDominance}, map[string]bool{}, sim, false); !grid || !slices.Equal(got, []setup{sim, {threeZones, auto, auto, true}}) {
		t.Errorf("--sim: %v (grid %v), want the two layouts", got, grid)
	}
	got, _ := setupsFor([]string{bench.ScenarioDominance}, map[string]bool{"client-cpu": true}, setup{"", auto, "0.7", false}, false)
	for _, s := range got {
		if want := map[string]string{auto: "0.7", "0": auto}[s.memberCPU]; s.clientCPU != want {
			t.Errorf("%+v: client %s, want %s", s, s.clientCPU, want)
		}
	}
}

// TestSetupOptions: the grid's setups name their layout, and the shared
// cores leave the client unconfined.
func TestSetupOptions(t *testing.T) {
	base := bench.Options{Workload: bench.DefaultWorkload(), Nodes: 3}
	opts, err := setup{threeZones, "0", auto, false}.options(base, "zk")
	if err != nil {
		t.Fatal(err)
	}
	if opts.TopologyName != threeZones || opts.Topology == nil || opts.ClientCPU != 0 || bench.BudgetsOf(opts.Backend).Confined() || opts.Backend.Name() != "zk" {
		t.Errorf("three zones on shared cores: %+v", opts)
	}
	if opts, err = (setup{"", "0", auto, false}).options(base, "etcd"); err != nil || opts.TopologyName != "default" || opts.Topology != nil {
		t.Errorf("default topology: %+v, %v", opts, err)
	}
	if _, err := (setup{"", "0", auto, false}).options(base, "mongo"); err == nil {
		t.Error("an unknown backend was accepted")
	}
	// --sim: a simulated backend of the store's kind, on the layout.
	if opts, err = (setup{threeZones, auto, auto, true}).options(base, "etcd"); err != nil || opts.Backend.Name() != "sim" || opts.TopologyName != threeZones {
		t.Errorf("--sim: %+v, %v", opts, err)
	}
}
