package etcd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/internal/liveness"
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
//
// A member that stops answering while the client sends it nothing new (a
// frozen process fails nothing) is noticed from the streams themselves: a
// silent watch stream is asked for its progress (see watchQuietAfter), a
// keep-alive must be answered (keepAliveAnswerWithin).
type streams struct {
	r     func() *router.Router
	probe func(ctx context.Context, m router.Member) error // the client's probe of one member
	mu    sync.Mutex
	open  map[*trackedStream]struct{}
	// confirming: members whose probe a miss asked for is under way.
	confirming map[int]bool
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

	// A watch stream's liveness check (see watchQuietAfter).
	watch        bool
	live         *liveness.Check
	sendMu       sync.Mutex   // SendMsg is not safe from two goroutines: clientv3's and the check's
	owed         atomic.Int64 // the check's progress requests not yet answered
	userProgress atomic.Int64 // the caller's own progress requests not yet answered
	answers      atomic.Bool  // a progress request was answered since the last watcher was created
}

// keepAliveAnswerWithin is how long a keep-alive may go unanswered before
// the router probes. The leader answers a renew from memory (it is no Raft
// proposal), in milliseconds, but a settled router probes only every
// StableProbeInterval (10 s), and a lease expires its TTL (often 5 s) after
// its last answer, while the next keep-alive leaves a third of it later.
// Half a second leaves the election and the stream's move time within the
// rest; a false alarm costs a few probe rounds.
const keepAliveAnswerWithin = 500 * time.Millisecond

// A watch stream silent for watchQuietAfter is asked for its progress. A
// member answers from memory in about a round trip, but only while every
// watcher on the stream is synced and starts at or below its revision:
// etcd drops the request otherwise (a watcher catching up on history, one
// opened at a future revision, as clientv3 resumes watches and Kubernetes
// opens them, on a cluster with no write since). So a miss on a stream
// that has answered one of the check's requests since its last watcher
// was created counts as a failed probe of its member (router.Backend.Unanswered);
// a miss on one that has not is confirmed first by a probe of the member
// (Status, within confirmTimeout), and only a failed one counts. The wait
// before the next request doubles with each miss, up to watchQuietMax.
// From a frozen member's last message to the streams' move: about
// watchQuietAfter + watchAnswerWithin + one ProbeTimeout (0.5 s by
// default), 2.4 s, on a stream that answers. Each request costs the member
// a small message in and one out on a stream it already has (with gRPC's
// flow-control pings, about 0.45 ms of member CPU on the test bed), once
// per 1.5 s of an idle watch's life: the rate that keeps a fleet's cost
// within 0.05 cores per 100 clients.
const (
	watchQuietAfter   = 1500 * time.Millisecond
	watchAnswerWithin = 400 * time.Millisecond
	watchQuietMax     = 6 * time.Second
	confirmTimeout    = 500 * time.Millisecond
)

// Only the streams clientv3 reopens and resumes are moved: a Watch resumes
// from its revision, a LeaseKeepAlive stream is simply reopened. A Snapshot
// or RangeStream cut midway would fail its caller.
var movableMethods = map[string]bool{
	watchMethod:     true,
	keepAliveMethod: true,
}

const (
	watchMethod     = "/etcdserverpb.Watch/Watch"
	keepAliveMethod = "/etcdserverpb.Lease/LeaseKeepAlive"
)

type streamKey struct{}

// errMoved is the cause a moved stream's context is cancelled with.
var errMoved = errors.New("oproute: member stopped serving; stream moved")

func newStreams(r func() *router.Router, probe func(context.Context, router.Member) error) *streams {
	return &streams{r: r, probe: probe, open: map[*trackedStream]struct{}{}, confirming: map[int]bool{}}
}

// intercept is the client's stream interceptor: it gives each stream a
// context of its own to cut it by, and a handle the picker fills in.
func (ss *streams) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if !movableMethods[method] {
		return streamer(ctx, desc, cc, method, opts...)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	ts := &trackedStream{cancel: cancel, keepAlive: method == keepAliveMethod, watch: method == watchMethod}
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
	ms := &movableStream{ClientStream: cs, ts: ts, ss: ss}
	if ts.watch {
		ts.live = liveness.Start(liveness.Config{
			QuietAfter: watchQuietAfter, AnswerWithin: watchAnswerWithin, QuietMax: watchQuietMax,
			Ask:    ms.askProgress,
			Missed: func() { ss.missed(ts) },
			Over:   func() bool { return sctx.Err() != nil },
		})
		context.AfterFunc(sctx, ts.live.Stop)
	}
	return ms, nil
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
		case !r.Backend().Serves(m):
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
//
// On a watch stream it serialises the caller's sends with the liveness
// check's, and notes what the check must know: a new watcher may leave
// progress requests unanswered, and the caller's own progress requests
// take the next answers (the check's outstanding ones are then the
// caller's too: an extra answer is a true statement of progress, a
// swallowed one would leave the caller with an older one).
func (s *movableStream) SendMsg(m any) error {
	if s.ts.watch {
		if req, ok := m.(*pb.WatchRequest); ok {
			switch {
			case req.GetProgressRequest() != nil:
				s.ts.userProgress.Add(1)
				s.ts.owed.Store(0)
			case req.GetCreateRequest() != nil:
				s.ts.answers.Store(false)
			}
		}
		s.ts.sendMu.Lock()
		defer s.ts.sendMu.Unlock()
	}
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
				r.Backend().Unsettle()
			}
		})
	}
	return nil
}

func (s *movableStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	for err == nil && s.ts.watch && s.ownProgress(m) {
		err = s.ClientStream.RecvMsg(m) // the check's answer: not the caller's
	}
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

// ownProgress notes that the watch stream received m (any message shows
// the member alive), and reports whether m answers a progress request of
// the check's own, which the caller never asked for and must not see. The
// answers look alike: the caller's outstanding requests take them first.
func (s *movableStream) ownProgress(m any) bool {
	ts := s.ts
	ts.live.Heard()
	resp, ok := m.(*pb.WatchResponse)
	if !ok || resp.GetWatchId() != clientv3.InvalidWatchID || len(resp.GetEvents()) > 0 || resp.GetCreated() || resp.GetCanceled() || resp.GetCompactRevision() != 0 {
		return false
	}
	ts.answers.Store(true)
	return !takeOne(&ts.userProgress) && takeOne(&ts.owed)
}

// takeOne decrements n if it is positive, and reports whether it did.
func takeOne(n *atomic.Int64) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// askProgress is the liveness check's request: a progress request of its
// own on the stream.
func (s *movableStream) askProgress() error {
	s.ts.owed.Add(1)
	s.ts.sendMu.Lock()
	defer s.ts.sendMu.Unlock()
	return s.ClientStream.SendMsg(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
}

// missed reports a progress request left unanswered on ts: to the router
// (Unanswered) at once if the stream has answered since its last watcher
// was created, else if a probe of the member fails too.
func (ss *streams) missed(ts *trackedStream) {
	m := int(ts.member.Load())
	if !ts.answers.Load() {
		go ss.confirm(m)
		return
	}
	if r := ss.r(); r != nil {
		r.Backend().Unanswered(m)
	}
}

// confirm probes member m after a miss on a stream that may not answer
// progress requests, and reports it to the router (Unanswered) if the
// probe fails too. One probe per member at a time.
func (ss *streams) confirm(m int) {
	r := ss.r()
	if r == nil {
		return
	}
	mem, ok := r.Member(m)
	if !ok {
		return
	}
	ss.mu.Lock()
	if ss.confirming[m] {
		ss.mu.Unlock()
		return
	}
	ss.confirming[m] = true
	ss.mu.Unlock()
	defer func() {
		ss.mu.Lock()
		delete(ss.confirming, m)
		ss.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), confirmTimeout)
	defer cancel()
	if err := ss.probe(ctx, mem); err != nil {
		r.Backend().Unanswered(m)
	}
}
