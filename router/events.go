package router

import (
	"context"
	"log/slog"
	"slices"
	"time"
)

// Event is a routing decision worth a log line: one per change, never one
// per operation.
type Event struct {
	// Kind is one of the Event* constants.
	Kind string
	// Member is the member concerned ("" for none: a leader lost).
	Member string
	// Attrs are the evidence: why a member left the pool (read EWMA
	// against the others' median, failures in a row, probe round trip), the
	// former leader…
	Attrs []slog.Attr
	// Warn marks a backend's own event kind that loses something (a
	// ZooKeeper primary session expired); the router's kinds have their
	// level in Level.
	Warn bool
}

// Event kinds.
const (
	EventLeaderChanged = "leader_changed"     // Member leads now (attr from: the former leader)
	EventLeaderLost    = "leader_lost"        // no member is known to lead
	EventUnreachable   = "member_unreachable" // probes fail, or it says it does not serve
	EventReachable     = "member_reachable"   // back
	EventLeftPool      = "member_left_pool"   // out of the read pool (attr reason, evidence)
	EventBackInPool    = "member_back_in_pool"
)

// Level is the slog level an event deserves: losing something warns.
func (e Event) Level() slog.Level {
	if e.Warn {
		return slog.LevelWarn
	}
	switch e.Kind {
	case EventLeaderLost, EventUnreachable, EventLeftPool:
		return slog.LevelWarn
	}
	return slog.LevelInfo
}

// SlogEvents returns an OnEvent that logs each event on l, one line each,
// with the member and the evidence as attributes.
func SlogEvents(l *slog.Logger) func(Event) {
	return func(e Event) {
		attrs := append([]slog.Attr{slog.String("component", "oproute")}, e.Attrs...)
		if e.Member != "" {
			attrs = append(attrs, slog.String("member", e.Member))
		}
		l.LogAttrs(context.Background(), e.Level(), e.Kind, attrs...)
	}
}

// startupProbeFailures is how many failed probes in a row announce a
// member that was never reached.
const startupProbeFailures = 8

// eventsLocked compares the snapshot before and after a probe round and
// reports what changed. Caller must hold r.mu.
func (r *Router) eventsLocked(prev, next *snapshot, leaderUnsure bool) {
	if r.cfg.OnEvent == nil || prev == nil {
		return
	}
	emit := r.cfg.OnEvent
	// Leader events compare with the last leader announced, not with the
	// previous snapshot: a failed pinned write clears the snapshot's leader
	// until the next round, which is no change of leader. A round that does
	// not trust its word for the leader (leaderUnsure) announces nothing.
	switch {
	case leaderUnsure:
	case next.leader >= 0 && next.leader != r.announcedLeader:
		e := Event{Kind: EventLeaderChanged, Member: r.roster().members[next.leader].ID}
		if r.announcedLeader >= 0 {
			e.Attrs = append(e.Attrs, slog.String("from", r.roster().members[r.announcedLeader].ID))
		}
		r.announcedLeader = next.leader
		emit(e)
	case next.leader < 0 && r.announcedLeader >= 0:
		emit(Event{Kind: EventLeaderLost, Attrs: []slog.Attr{slog.String("was", r.roster().members[r.announcedLeader].ID)}})
		r.announcedLeader = -1
	}
	median := time.Duration(r.readMedian.Load())
	ro := r.roster()
	for i, m := range ro.members {
		if ro.retired[i] {
			continue
		}
		h := ro.health[i]
		// Down by the member's own evidence (not by the snapshot's
		// reachable set, which keeps everyone when nothing answers). A
		// member never reached is announced only after a couple of
		// seconds of failed probes: at start-up connections are still
		// being dialled.
		down := h.probeFailures >= r.cfg.UnreachableAfter || (h.probed && h.lastProbe.NotServing)
		switch {
		case down && !h.downAnnounced && (h.reached || h.probeFailures >= startupProbeFailures):
			h.downAnnounced = true
			attrs := []slog.Attr{slog.Int("failed_probes", h.probeFailures)}
			if h.probeErr != nil {
				attrs = append(attrs, slog.String("error", h.probeErr.Error()))
			}
			if h.probed && h.lastProbe.NotServing {
				attrs = append(attrs, slog.Bool("not_serving", true))
			}
			emit(Event{Kind: EventUnreachable, Member: m.ID, Attrs: attrs})
		case !down && h.downAnnounced:
			h.downAnnounced = false
			emit(Event{Kind: EventReachable, Member: m.ID})
		}
		was, is := slices.Contains(prev.reachable, i), slices.Contains(next.reachable, i)
		if !is {
			continue
		}
		wasOut := !was || !prev.has(i)
		isOut := !next.has(i)
		switch {
		case isOut && !wasOut && !h.outAnnounced:
			h.outAnnounced = true
			reason := h.ejectWhy
			if slices.Contains(next.benched, i) {
				reason = h.benchWhy
			}
			emit(Event{Kind: EventLeftPool, Member: m.ID, Attrs: []slog.Attr{
				slog.String("reason", reason),
				slog.Duration("read_ewma", h.read.Value()),
				slog.Duration("read_median", median),
				slog.Int64("read_failures_in_a_row", int64(h.readFailStreak.Load())),
				slog.Duration("probe_rtt", h.probe.Value()),
				slog.Uint64("ejections", h.totalEjected),
			}})
		case !isOut && h.outAnnounced:
			h.outAnnounced = false
			emit(Event{Kind: EventBackInPool, Member: m.ID})
		}
	}
}
