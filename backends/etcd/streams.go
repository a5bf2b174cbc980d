package etcd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/router"
)

// streams tracks the client's open gRPC streams (Watch, LeaseKeepAlive,
// Observe, …) by the member each was picked on. A stream is picked once: on
// a member that stops serving (unreachable, frozen, no leader) it would go
// silent for good — a watch misses its events, a keep-alive stream lets its
// leases expire. After every probe round the streams on such members are
// cut with codes.Unavailable, which clientv3's watcher and lessor answer by
// opening a new stream (the watcher resumes from the revision after the
// last event it delivered, so nothing is lost or repeated), and the picker
// puts the new stream on a member that serves.
type streams struct {
	r    func() *router.Router
	mu   sync.Mutex
	open map[*trackedStream]struct{}
}

type trackedStream struct {
	member   atomic.Int32 // the member it was picked on; -1 before the pick
	forced   atomic.Bool  // the caller named the member (WithMember): never moved
	toLeader atomic.Bool  // leader-bound: moved only when its member is unreachable
	cancel   context.CancelCauseFunc
	moved    atomic.Bool

	// A keep-alive stream's requests each get an answer from the leader;
	// one left unanswered past keepAliveAnswerWithin is evidence.
	keepAlive bool
	sent      atomic.Uint64
	answered  atomic.Uint64
	watching  atomic.Bool // a check of the answers is armed
}

// keepAliveAnswerWithin is how long a keep-alive may go unanswered before
// the router probes. The leader answers a renew from memory (it is no Raft
// proposal), in milliseconds, but a settled router probes only every
// StableProbeInterval (10 s), and a lease expires its TTL (often 5 s) after
// its last answer, while the next keep-alive leaves a third of it later.
// Half a second leaves the election and the stream's move time within the
// rest; a false alarm costs a few probe rounds.
const keepAliveAnswerWithin = 500 * time.Millisecond

// Only the streams clientv3 reopens and resumes are moved: a Watch resumes
// from its revision, a LeaseKeepAlive stream is simply reopened. A Snapshot
// or RangeStream cut midway would fail its caller.
var movableMethods = map[string]bool{
	"/etcdserverpb.Watch/Watch": true,
	keepAliveMethod:             true,
}

const keepAliveMethod = "/etcdserverpb.Lease/LeaseKeepAlive"

type streamKey struct{}

// errMoved is the cause a moved stream's context is cancelled with.
var errMoved = errors.New("oproute: member stopped serving; stream moved")

func newStreams(r func() *router.Router) *streams {
	return &streams{r: r, open: map[*trackedStream]struct{}{}}
}

// intercept is the client's stream interceptor: it gives each stream a
// context of its own to cut it by, and a handle the picker fills in.
func (ss *streams) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if !movableMethods[method] {
		return streamer(ctx, desc, cc, method, opts...)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	ts := &trackedStream{cancel: cancel, keepAlive: method == keepAliveMethod}
	ts.member.Store(-1)
	cs, err := streamer(context.WithValue(sctx, streamKey{}, ts), desc, cc, method, opts...)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	ss.mu.Lock()
	ss.open[ts] = struct{}{}
	ss.mu.Unlock()
	// However the stream ends (the caller cancels, it fails, it is moved),
	// its context ends with it and it leaves the table.
	context.AfterFunc(sctx, func() {
		ss.mu.Lock()
		delete(ss.open, ts)
		ss.mu.Unlock()
	})
	return &movableStream{ClientStream: cs, ts: ts, ss: ss}, nil
}

// picked records where the stream on ctx, if any, was sent, and whether
// the caller forced it there or it belongs with the leader.
func picked(ctx context.Context, member int, forced, toLeader bool) {
	if ts, ok := ctx.Value(streamKey{}).(*trackedStream); ok {
		ts.forced.Store(forced)
		ts.toLeader.Store(toLeader)
		ts.member.Store(int32(member))
	}
}

// moveOff cuts every stream on a member that no longer serves. It runs
// after each probe round.
func (ss *streams) moveOff() {
	r := ss.r()
	if r == nil {
		return
	}
	ss.mu.Lock()
	var cut []*trackedStream
	for ts := range ss.open {
		m := int(ts.member.Load())
		switch {
		case m < 0 || ts.forced.Load():
		case ts.toLeader.Load():
			// Its place is the leader's, whatever the probes say of it. One
			// that fell back to another member while the leader was unknown
			// moves once it is known: a follower forwards keep-alives to
			// the leader it last knew, and waits for a frozen one for
			// etcd's request timeout (~7 s), longer than a short TTL.
			if l, known := r.Leader(); !r.Reachable(m) || (known && l != m) {
				cut = append(cut, ts)
			}
		case !r.Serves(m):
			cut = append(cut, ts)
		}
	}
	ss.mu.Unlock()
	for _, ts := range cut {
		ts.moved.Store(true)
		ts.cancel(errMoved)
	}
}

// movableStream reports a moved stream's end as codes.Unavailable, which
// clientv3 retries, instead of the codes.Canceled its cut context leaves
// (which clientv3 would take for the caller's own cancel and give up).
type movableStream struct {
	grpc.ClientStream
	ts *trackedStream
	ss *streams
}

// SendMsg arms, for a keep-alive, a check that it is answered in time: a
// frozen leader fails nothing, it only leaves the stream silent, and a
// settled router would not notice before the lease ran out.
func (s *movableStream) SendMsg(m any) error {
	if err := s.ClientStream.SendMsg(m); err != nil {
		return err
	}
	if !s.ts.keepAlive {
		return nil
	}
	n := s.ts.sent.Add(1)
	if s.ts.watching.CompareAndSwap(false, true) {
		time.AfterFunc(keepAliveAnswerWithin, func() {
			s.ts.watching.Store(false)
			if s.ts.answered.Load() >= n || s.Context().Err() != nil {
				return
			}
			if r := s.ss.r(); r != nil {
				r.Unsettle()
			}
		})
	}
	return nil
}

func (s *movableStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		if s.ts.keepAlive {
			s.ts.answered.Add(1)
		}
		return nil
	}
	s.ts.cancel(nil) // the stream is over: release its context
	if s.ts.moved.Load() {
		return status.Error(codes.Unavailable, errMoved.Error())
	}
	return err
}
