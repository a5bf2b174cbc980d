package zk

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/internal/zk4lw"
	"github.com/oproute/oproute/router"
)

func TestOutcomeOf(t *testing.T) {
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want router.Outcome
	}{
		{"success", live, nil, router.OK},
		{"connection closed is the server's", live, zk.ErrConnectionClosed, router.MemberFault},
		{"no server is the server's", live, zk.ErrNoServer, router.MemberFault},
		{"session moved is the server's", live, zk.ErrSessionMoved, router.MemberFault},
		{"session expired is the server's", live, zk.ErrSessionExpired, router.MemberFault},
		{"closing is the server's", live, zk.ErrClosing, router.MemberFault},
		{"system error is the server's", live, zk.ErrUnknown, router.MemberFault},
		{"operation timeout is the server's", live, errors.New("unknown error: -7"), router.MemberFault},
		{"unknown session is the server's", live, errors.New("unknown error: -15"), router.MemberFault},
		{"throttled is overload", live, errors.New("unknown error: -127"), router.Overloaded},
		{"quota exceeded is an answer", live, errors.New("unknown error: -125"), router.AppError},
		{"unimplemented is an answer", live, errors.New("unknown error: -6"), router.AppError},
		{"ephemeral on local session is an answer", live, errors.New("unknown error: -120"), router.AppError},
		{"no node is an answer", live, zk.ErrNoNode, router.AppError},
		{"node exists is an answer", live, zk.ErrNodeExists, router.AppError},
		{"not empty is an answer", live, zk.ErrNotEmpty, router.AppError},
		{"bad version is an answer", live, zk.ErrBadVersion, router.AppError},
		{"ephemeral children is an answer", live, zk.ErrNoChildrenForEphemerals, router.AppError},
		{"no auth is an answer", live, zk.ErrNoAuth, router.AppError},
		{"auth failed is an answer", live, zk.ErrAuthFailed, router.AppError},
		{"invalid ACL is an answer", live, zk.ErrInvalidACL, router.AppError},
		{"invalid flags is an answer", live, zk.ErrInvalidFlags, router.AppError},
		{"invalid path is an answer", live, zk.ErrInvalidPath, router.AppError},
		{"bad arguments is an answer", live, zk.ErrBadArguments, router.AppError},
		{"API error is an answer", live, zk.ErrAPIError, router.AppError},
		{"nothing is an answer", live, zk.ErrNothing, router.AppError},
		{"reconfig disabled is an answer", live, zk.ErrReconfigDisabled, router.AppError},
		{"multi rolled back is an answer", live, ErrMultiRolledBack, router.AppError},
		{"wrapped answer", live, fmt.Errorf("create: %w", zk.ErrNodeExists), router.AppError},
		{"wrapped server error", live, fmt.Errorf("oproute/zk: %w", zk.ErrConnectionClosed), router.MemberFault},
		{"caller's deadline", live, context.DeadlineExceeded, router.CallerGaveUp},
		{"caller's cancel", live, context.Canceled, router.CallerGaveUp},
		{"any error once the caller's context ended", ended, zk.ErrConnectionClosed, router.CallerGaveUp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := outcomeOf(tc.ctx, tc.err); got != tc.want {
				t.Fatalf("outcomeOf(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestProbeResult(t *testing.T) {
	const epoch = 7 << 32
	for _, tc := range []struct {
		srvr zk4lw.Srvr
		want router.ProbeResult
	}{
		{zk4lw.Srvr{Mode: "leader", Zxid: epoch | 42}, router.ProbeResult{IsLeader: true, Term: 7, Committed: epoch | 42}},
		// A new leader before its first commit: a caught-up follower is
		// still at the old epoch, so nothing is known to be committed.
		{zk4lw.Srvr{Mode: "leader", Zxid: epoch}, router.ProbeResult{IsLeader: true, Term: 7}},
		{zk4lw.Srvr{Mode: "standalone", Zxid: epoch | 1}, router.ProbeResult{IsLeader: true, Term: 7, Committed: epoch | 1}},
		{zk4lw.Srvr{Mode: "follower", Zxid: 6<<32 | 900}, router.ProbeResult{Applied: 6<<32 | 900}},
		{zk4lw.Srvr{Mode: "observer", Zxid: epoch | 40}, router.ProbeResult{Applied: epoch | 40}},
		{zk4lw.Srvr{Mode: "read-only"}, router.ProbeResult{NotServing: true}},
	} {
		if got := probeResult(tc.srvr); got != tc.want {
			t.Errorf("%+v: got %+v, want %+v", tc.srvr, got, tc.want)
		}
	}
}
