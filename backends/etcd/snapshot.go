package etcd

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// snapshotIdle ends a Snapshot's bench when its caller has read nothing
// for that long: a member streams only as fast as it is read (gRPC's flow
// control), so a caller that stops reading leaves it unloaded.
const snapshotIdle = 2 * time.Second

// benchHold keeps the bench of a Snapshot's member (router.Backend.Busy,
// taken by the picker) and ends it when the stream ends, its caller stops
// reading, or its context ends: gRPC tells the picker a stream is done
// only when the caller reads to its end or cancels it, which a caller
// that drops a snapshot midway may never do.
type benchHold struct {
	mu    sync.Mutex
	end   func()
	idle  *time.Timer
	ended bool
}

type benchHoldKey struct{}

// hold takes end, the bench's end, from the picker; a hold already ended
// (the stream failed before the pick was kept) ends it at once.
func (h *benchHold) hold(end func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		end()
		return
	}
	prev := h.end
	h.end = end
	if prev != nil {
		prev() // a pick gRPC made again (a transparent retry): one bench at a time
	}
}

// release ends the bench, once.
func (h *benchHold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return
	}
	h.ended = true
	if h.idle != nil {
		h.idle.Stop()
	}
	if h.end != nil {
		h.end()
	}
}

// holdSnapshotBench runs a Snapshot stream with its bench held by a
// benchHold; other streams pass through.
func holdSnapshotBench(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if method != snapshotMethod {
		return streamer(ctx, desc, cc, method, opts...)
	}
	h := &benchHold{}
	cs, err := streamer(context.WithValue(ctx, benchHoldKey{}, h), desc, cc, method, opts...)
	if err != nil {
		h.release()
		return nil, err
	}
	h.mu.Lock()
	h.idle = time.AfterFunc(snapshotIdle, h.release)
	h.mu.Unlock()
	context.AfterFunc(ctx, h.release)
	return &heldStream{ClientStream: cs, hold: h}, nil
}

// heldStream ends its bench on the stream's end or error, and keeps it
// while the caller reads.
type heldStream struct {
	grpc.ClientStream
	hold *benchHold
}

func (s *heldStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.hold.release()
		return err
	}
	s.hold.mu.Lock()
	if !s.hold.ended {
		s.hold.idle.Reset(snapshotIdle)
	}
	s.hold.mu.Unlock()
	return nil
}
