// Package members holds what both backends do alike with the endpoints
// and routing options a user gives them: the options they share, and the
// router's member list with its duplicate check.
package members

import (
	"fmt"

	"github.com/oproute/oproute/router"
)

// Options are the routing options both backends offer (WithPolicy,
// WithZones, WithHedgedReads, WithLoadAwareReads, WithRouterConfig).
type Options struct {
	Policy     string
	ClientZone string
	Zones      map[string]string // endpoint as given → zone
	Hedge      *router.HedgeConfig
	LoadAware  bool
	Tune       func(*router.Config)
}

// Config returns the router configuration the options ask for, from base
// (a backend's own defaults); Tune runs last, before the backend sets
// Members and Prober.
func (o Options) Config(base router.Config) router.Config {
	cfg := base
	if o.Policy != "" {
		cfg.Policy = o.Policy
	}
	cfg.ClientZone = o.ClientZone
	cfg.Hedge, cfg.LoadAware = o.Hedge, o.LoadAware
	if o.Tune != nil {
		o.Tune(&cfg)
	}
	return cfg
}

// Build returns the router's members for endpoints, as given (the member
// ID) and as addressed (addrOf, which validates), with the index of each
// address. Two endpoints with the same address are an error wrapping
// router.ErrDuplicateMember.
func Build(endpoints []string, addrOf func(string) (string, error), zones map[string]string) ([]router.Member, map[string]int, error) {
	ms := make([]router.Member, len(endpoints))
	byAddr := make(map[string]int, len(endpoints))
	for i, ep := range endpoints {
		addr, err := addrOf(ep)
		if err != nil {
			return nil, nil, err
		}
		if _, dup := byAddr[addr]; dup {
			return nil, nil, fmt.Errorf("%w: endpoint %q", router.ErrDuplicateMember, ep)
		}
		byAddr[addr] = i
		ms[i] = router.Member{ID: ep, Addr: addr, Zone: zones[ep]}
	}
	return ms, byAddr, nil
}
