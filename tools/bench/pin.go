package bench

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oproute/oproute/router"
)

// writePin sends a client's writes to one member, for the comparators that
// are not router policies: Oracle follows the servers' own word on the
// leader, StaticLeader keeps the leader of the start forever.
type writePin struct {
	endpoints []string // nil: writes are routed
	pinned    atomic.Int64
	stop      chan struct{}
	wg        sync.WaitGroup
}

// routedPolicy is the router policy a client runs for policy: the
// comparators route their reads like hybrid.
func routedPolicy(policy string) string {
	switch policy {
	case Oracle, StaticLeader, EveryRound:
		return router.Hybrid
	}
	return policy
}

// routerTune is what policy changes in the router's configuration.
func routerTune(policy string) func(*router.Config) {
	return func(rc *router.Config) {
		if policy == EveryRound {
			rc.StableProbeInterval = rc.ProbeInterval
			if rc.StableProbeInterval == 0 {
				rc.StableProbeInterval = router.DefaultProbeInterval
			}
		}
	}
}

// connectPinned connects a client and pins its writes where policy says;
// onTestbed says whether the cluster's leader can be followed (the oracle
// needs the test bed). A client whose pin cannot start is closed.
func connectPinned[C io.Closer](ctx context.Context, policy string, cl Cluster, onTestbed bool, connect func() (C, error)) (C, *writePin, error) {
	cli, err := connect()
	if err != nil {
		return cli, nil, err
	}
	p := &writePin{}
	if err := p.start(ctx, policy, cl, onTestbed); err != nil {
		cli.Close()
		return cli, nil, err
	}
	return cli, p, nil
}

// start pins writes when policy is a comparator.
func (p *writePin) start(ctx context.Context, policy string, cl Cluster, onTestbed bool) error {
	if policy != Oracle && policy != StaticLeader {
		return nil
	}
	if policy == Oracle && !onTestbed {
		return errors.New("bench: the oracle needs the test bed's view of the leader")
	}
	leader, err := cl.Leader(ctx)
	if err != nil {
		return err
	}
	p.pinned.Store(int64(leader))
	p.endpoints = cl.Endpoints()
	if policy == Oracle {
		p.stop = make(chan struct{})
		p.wg.Go(func() { p.follow(cl) })
	}
	return nil
}

// follow keeps the oracle's pin on the leader as the servers report it.
func (p *writePin) follow(cl Cluster) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if l, err := cl.Leader(ctx); err == nil {
				p.pinned.Store(int64(l))
			}
			cancel()
		}
	}
}

// route returns ctx with the write pinned by withMember (the backend's
// WithMember), or ctx itself when writes are routed.
func (p *writePin) route(ctx context.Context, withMember func(context.Context, string) context.Context) context.Context {
	if p.endpoints == nil {
		return ctx
	}
	return withMember(ctx, p.endpoints[p.pinned.Load()])
}

func (p *writePin) close() {
	if p.stop != nil {
		close(p.stop)
		p.wg.Wait()
	}
}
