package router

import (
	"context"
	"testing"
	"time"
)

func TestLeaderUnknownFallsBackToRoundRobin(t *testing.T) {
	tr := newTestRouter(t, Config{})
	tr.cluster.set("", 1)
	tr.probeRound()
	writes := tr.run(t, 300, Write, flat(time.Millisecond))
	if len(writes) != 3 || writes["m0"] != 100 {
		t.Fatalf("writes with no leader = %v, want round robin", writes)
	}
	if got := tr.Stats().Fallbacks; got != 300 {
		t.Fatalf("fallbacks = %d, want 300", got)
	}
}

func TestFailedLeaderWriteClearsLeaderAtOnce(t *testing.T) {
	tr := newTestRouter(t, Config{})
	// The test drives the re-probe: a background round between the failure
	// and the checks below would find m1 before they look.
	tr.cancel()
	<-tr.done
	p, _ := tr.Pick(context.Background(), Write)
	if p.Member.ID != "m0" {
		t.Fatalf("write went to %s, want leader m0", p.Member.ID)
	}
	tr.cluster.set("m1", 2, "m0") // leader dies, m1 takes over
	p.Done(MemberFault)
	if st := tr.Stats(); st.Leader != "" {
		t.Fatalf("leader still %q after a failed pinned write", st.Leader)
	}
	next, _ := tr.Pick(context.Background(), Write)
	next.Done(OK)
	if tr.Stats().Fallbacks != 1 {
		t.Fatal("write after the failure did not fall back")
	}
	select {
	case <-tr.refreshc:
	default:
		t.Fatal("the failed pinned write asked for no re-probe")
	}
	tr.probeRound()
	if l := tr.Stats().Leader; l != "m1" {
		t.Fatalf("leader %q after the re-probe, want m1", l)
	}
	if got := tr.Stats().LeaderChanges; got != 1 {
		t.Fatalf("leader changes = %d, want 1", got)
	}
}

func TestHighestTermWins(t *testing.T) {
	tr := newTestRouter(t, Config{})
	// m2 is partitioned with a stale view (old term, old leader m0); m0 and
	// m1 agree on m1 at a newer term.
	tr.cluster.set("m1", 5)
	tr.cfg.Prober = ProberFunc(func(ctx context.Context, m Member) (ProbeResult, error) {
		res, err := tr.cluster.Probe(ctx, m)
		if m.ID == "m2" {
			res.LeaderID, res.Term = "sid-m0", 4
		}
		return res, err
	})
	tr.probeRound()
	if got := tr.Stats().Leader; got != "m1" {
		t.Fatalf("leader = %q, want m1 (term 5 beats term 4)", got)
	}
}

func TestNoProberMeansNoLeader(t *testing.T) {
	r, err := New(Config{Members: members(3)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p, _ := r.Pick(context.Background(), Write)
	p.Done(OK)
	if r.Stats().Leader != "" || r.Stats().Fallbacks != 1 {
		t.Fatalf("stats = %+v", r.Stats())
	}
}
