package zk

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oproute/oproute/internal/liveness"
)

// ZooKeeper opcodes the connection wrapper looks for in request headers.
const opSetWatches = 101

// pingFrame is a ZooKeeper ping request: length 8, xid -2 (pings' own,
// whose replies go-zookeeper's receive loop ignores), opcode 11.
var pingFrame = []byte{0, 0, 0, 8, 0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 11}

// A session's connection silent for liveQuietAfter gets a ping of the
// wrapper's own; no byte back within liveAnswerWithin counts as a failed
// probe of the server (router.Backend.Unanswered), and the router probes at once
// (and moves the session if the server fails that probe too): about 2.4 s
// from the server's last byte. go-zookeeper pings every third of the
// session timeout and gives up on a server after two thirds of it (4 s of
// a 6 s session, 20 s of a 30 s one): a watch on a frozen server would
// wait that long. The wait before the next ping doubles with each one
// unanswered, up to liveQuietMax. A ping costs the server what
// go-zookeeper's own do.
const (
	liveQuietAfter   = 1500 * time.Millisecond
	liveAnswerWithin = 400 * time.Millisecond
	liveQuietMax     = 12 * time.Second
)

// cappedConn is the TCP connection go-zookeeper gets for a session. It
// caps the handshake's read deadline, reports a failed write once, and
// holds early replies back after a reconnect (replyHold).
//
// The cap: the handshake's read deadline is at most the session timeout (at
// least 2 s). go-zookeeper waits ten receive timeouts (6.7 session
// timeouts) for the answer to its connect request: a server that swallowed
// it (frozen, or partitioned while the client reconnected) would hold the
// session that long, and it would expire meanwhile. Only the handshake's
// deadline is capped (go-zookeeper clears it, with a zero deadline, once
// answered): later ones follow the negotiated timeout, which the server may
// have raised above the one asked for.
type cappedConn struct {
	net.Conn
	max           time.Duration
	handshakeDone *atomic.Bool
	writeFailed   *atomic.Bool // a write failed: see Write
	hold          *replyHold
	writeMu       *sync.Mutex     // one writer at a time: go-zookeeper's send loop, or a ping; nil without a silence check
	live          *liveness.Check // nil: no silence check
}

// newCappedConn wraps conn; with onSilent, it checks the connection for
// silence while wanted says the session may hold watches (see
// liveQuietAfter) and calls onSilent on a ping left unanswered.
func newCappedConn(conn net.Conn, max time.Duration, watching bool, wanted func() bool, onSilent func()) cappedConn {
	c := cappedConn{conn, max, new(atomic.Bool), new(atomic.Bool), &replyHold{armed: watching, released: make(chan struct{})}, nil, nil}
	if onSilent == nil {
		return c
	}
	c.writeMu = new(sync.Mutex)
	c.live = liveness.Start(liveness.Config{
		QuietAfter: liveQuietAfter, AnswerWithin: liveAnswerWithin, QuietMax: liveQuietMax,
		Ask: func() error {
			c.writeMu.Lock()
			defer c.writeMu.Unlock()
			_, err := c.Conn.Write(pingFrame)
			return err
		},
		Missed: onSilent,
		// Only once go-zookeeper's receive loop reads: it starts after a
		// session was established (a connection whose handshake said
		// "expired" is never read again, and fails on its next write).
		Ready: func() bool { return c.hold.recvStarted.Load() && wanted() },
	})
	return c
}

// Write reports a failed write as written and closes the connection, so
// that the failure reaches go-zookeeper once, through the receive side.
// go-zookeeper's sendData, when a write fails, fills the request's one-slot
// reply channel itself and leaves the request registered; when that request
// is the credentials resent on reconnect (opSetAuth), nothing reads the
// slot, and the loop's flushRequests then blocks on it for ever, holding
// requestsLock: the session never redials and its Close never returns
// (go-zookeeper PR #163, open). Reported this way, the request stays
// registered with an empty slot, the receive loop ends on the closed
// connection, and flushRequests answers it once with ErrConnectionClosed —
// the outcome of a request whose bytes may or may not have left, which is
// what a caller gets for any cut connection. The same change, made in
// sendData (fail the request only if it is still registered), would fix it
// upstream.
//
// Only the first failure is reported so: later writes on the closed
// connection fail as usual, so that go-zookeeper's send loop stops there and
// leaves the requests it has not taken for the next connection.
func (c cappedConn) Write(b []byte) (int, error) {
	// length (4 bytes), xid (4), opcode (4)
	if len(b) >= 12 && int32(binary.BigEndian.Uint32(b[8:12])) == opSetWatches {
		c.hold.release()
	}
	if c.writeFailed.Load() {
		return 0, net.ErrClosed
	}
	if c.writeMu != nil {
		c.writeMu.Lock()
		defer c.writeMu.Unlock()
	}
	if _, err := c.Conn.Write(b); err != nil {
		c.writeFailed.Store(true)
		c.Conn.Close()
	}
	return len(b), nil
}

func (c cappedConn) SetReadDeadline(t time.Time) error {
	switch {
	case t.IsZero():
		c.handshakeDone.Store(true)
	case c.handshakeDone.Load():
		// The first deadline after the handshake is the receive loop's.
		c.hold.recvStarted.Store(true)
	case time.Until(t) > c.max:
		t = time.Now().Add(c.max)
	}
	return c.Conn.SetReadDeadline(t)
}

func (c cappedConn) Read(b []byte) (int, error) {
	n, err := c.read(b)
	if c.live != nil {
		if n > 0 {
			c.live.Heard()
		}
		if err != nil {
			c.live.Stop() // the connection is over
		}
	}
	return n, err
}

func (c cappedConn) read(b []byte) (int, error) {
	h := c.hold
	if len(h.pending) == 0 {
		if !h.holding() {
			return c.Conn.Read(b)
		}
		if err := h.readFrame(c.Conn); err != nil {
			return 0, err
		}
	}
	n := copy(b, h.pending)
	h.pending = h.pending[n:]
	return n, nil
}

func (c cappedConn) Close() error {
	if c.live != nil {
		c.live.Stop()
	}
	c.hold.release()
	return c.Conn.Close()
}

// replyHold keeps go-zookeeper's reconnect free of a data race (v1.0.4,
// conn.go): on every connection its loop goroutine reads lastZxid to
// re-register the session's watches (sendSetWatches), while the receive
// loop, started just before, writes lastZxid for every reply that carries a
// zxid. Nothing orders the two unless the reply's bytes were read after a
// write that follows the loop's read — and the first such write is the
// opSetWatches request itself: requests that waited out the disconnection
// go out before it, and their replies can arrive first. The value read is
// right either way (any zxid the session saw), but the race detector
// reports it, and a program tested under -race fails.
//
// So, on a connection of a session that may hold watches, the receive side
// hands over no reply carrying a zxid before go-zookeeper has written its
// opSetWatches request (the write and the read then happen in that order
// for the race detector too). Replies without a zxid pass (the credentials'
// answer, which go-zookeeper waits for before it sends anything else, and
// pings). A session whose watches have all fired sends no opSetWatches:
// its first such reply after a reconnect waits holdMax at most. One gap
// stays: an opSetWatches request left queued by a connection that died
// under it goes out first on the next one and releases the hold early.
// Upstream,
// reading lastZxid atomically (or before starting the receive loop) fixes
// the same.
type replyHold struct {
	armed       bool        // the session may hold watches
	recvStarted atomic.Bool // go-zookeeper's receive loop is reading
	once        sync.Once
	released    chan struct{} // closed by the opSetWatches write, or Close

	// Only the receive loop reads: no lock.
	passed  bool   // the hold is over for this connection
	pending []byte // a frame read ahead, not yet handed over
}

// holdMax bounds how long a reply waits for an opSetWatches request that a
// session without watches never sends.
const holdMax = 500 * time.Millisecond

func (h *replyHold) release() { h.once.Do(func() { close(h.released) }) }

func (h *replyHold) holding() bool {
	return h.armed && !h.passed && h.recvStarted.Load()
}

// readFrame reads one whole reply into pending, waiting for the release
// first if it carries a zxid.
func (h *replyHold) readFrame(conn net.Conn) error {
	var size [4]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		return err
	}
	frame := make([]byte, 4+int(binary.BigEndian.Uint32(size[:])))
	copy(frame, size[:])
	if _, err := io.ReadFull(conn, frame[4:]); err != nil {
		return err
	}
	// reply header: xid (4 bytes), zxid (8), err (4); only replies to
	// requests (xid ≥ 0) set lastZxid.
	if len(frame) >= 16 && int32(binary.BigEndian.Uint32(frame[4:8])) >= 0 && int64(binary.BigEndian.Uint64(frame[8:16])) > 0 {
		t := time.NewTimer(holdMax)
		select {
		case <-h.released:
		case <-t.C:
		}
		t.Stop()
		h.passed = true
	}
	h.pending = frame
	return nil
}
