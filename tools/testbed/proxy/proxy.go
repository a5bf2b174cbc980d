// Package proxy is a TCP proxy on 127.0.0.1 that delays, jitters or drops
// the bytes of each link, for emulating a multi-zone network on loopback.
//
// Each direction of each connection is a pipeline: a reader stamps every
// chunk with its due time (arrival + delay + jitter, never earlier than the
// previous chunk so that the stream stays in order) and a writer sends it
// when due. Bytes queued behind a delayed chunk do not pay the delay again,
// as they would with a sleep between read and write. The writer waits on a
// Linux timerfd read through the runtime poller: Go's timers round a 250 µs
// sleep up to about a millisecond, the timerfd does not.
//
// The shaping of a link is looked up for every chunk, so changes apply to
// live connections at once; Recheck applies a Reset to idle ones too. A connection's key comes from Config.Identify,
// which reads the first bytes the dialer sends (etcd's raft connections name
// their sender in an X-Server-From header), so one listener can give each
// sender its own delay.
//
// Forwarded counts the bytes written to each side by connection key, for
// pricing what crosses the emulated zones.
package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Link is the shaping of one direction of a connection.
type Link struct {
	// Delay is added to every chunk.
	Delay time.Duration
	// Jitter adds a uniform random extra in [−Jitter, +Jitter] per chunk
	// (the total never below zero).
	Jitter time.Duration
	// Blackhole drops every byte while set; connections stay open. Bytes
	// dropped from the middle of a stream are lost for good, which TCP
	// never does: use it to cut a link for longer than the protocol's own
	// timeouts, Stall for a partition that heals.
	Blackhole bool
	// Stall holds every byte while set and delivers it once cleared, as TCP
	// does across a network partition that heals before its retransmission
	// gives up: the proxy stops reading, so the sender's buffers fill and
	// it blocks. Bytes already on their way (delayed) still arrive.
	Stall bool
	// Reset makes the link fail fast while set, as a host that refuses a
	// port: each connection is reset (TCP RST to the dialer, and to the
	// target if dialled) when it is accepted, when bytes arrive on it, and
	// on Recheck even if idle. The target is not dialled for a connection
	// reset on accept. Set on either direction, it resets the connection;
	// it wins over Blackhole.
	Reset bool
	// ResetAfterReply resets each connection right after the first bytes
	// from the target have reached the dialer, as a reset that lands
	// between a handshake's answer and the client's next request. Read on
	// the downstream direction.
	ResetAfterReply bool
}

// Direction of a chunk.
type Direction int

const (
	// Upstream is from the dialer to the target.
	Upstream Direction = iota
	// Downstream is from the target back to the dialer.
	Downstream
)

// Config configures a Proxy.
type Config struct {
	// Target is the host:port connections are forwarded to. Required.
	Target string
	// Identify returns the key of a new connection from the first bytes
	// the dialer sent; it is called again with more bytes while it returns
	// more=true, up to 16 KiB. Nil gives every connection the key "".
	Identify func(first []byte) (key string, more bool)
	// Shape returns the current shaping for a connection's key and a
	// direction. Nil means no shaping. It is called from many goroutines
	// at once.
	Shape func(key string, dir Direction) Link
	// DialRetry is how long a refused connection to Target is retried
	// before the accepted connection is dropped. ZooKeeper's followers
	// connect to a new leader the moment it is elected, possibly before it
	// listens: refused, they retry; cut after an accept, they give up the
	// election round. Default none.
	DialRetry time.Duration
}

// Proxy forwards connections from its 127.0.0.1 listener to Config.Target.
type Proxy struct {
	cfg Config
	ln  net.Listener

	accepted atomic.Uint64

	mu     sync.Mutex
	flows  map[*flow]struct{}
	closed bool
	// forwarded counts bytes by connection key; an entry, once made, is
	// never replaced, so a flow adds to its own without the lock.
	forwarded map[string]*byteCounts
	wg        sync.WaitGroup
}

// byteCounts is the bytes forwarded for one key, indexed by Direction.
type byteCounts [2]atomic.Uint64

// Bytes is how many bytes a proxy has forwarded for one key.
type Bytes struct {
	// Upstream bytes were written to the target, Downstream bytes back to
	// the dialer.
	Upstream, Downstream uint64
}

// flow is one proxied connection: the dialer's and, once dialled, the one
// to the target. Proxy.mu guards up, identified and reset; key is set once,
// with identified.
type flow struct {
	down       net.Conn
	up         net.Conn // nil until dialled
	key        string
	identified bool // key is known
	reset      bool
	closed     atomic.Bool // set by close: a stalled reader gives up
}

// Accepted returns how many connections the proxy has accepted.
func (p *Proxy) Accepted() uint64 { return p.accepted.Load() }

// Forwarded returns the bytes forwarded since the proxy started, by
// connection key (Config.Identify's): the TCP payload written to the far
// side, counted once written, so neither bytes a Blackhole dropped nor
// bytes still delayed or lost with a reset connection count. A key is
// listed from its first connection's identification on.
func (p *Proxy) Forwarded() map[string]Bytes {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]Bytes, len(p.forwarded))
	for key, n := range p.forwarded {
		out[key] = Bytes{Upstream: n[Upstream].Load(), Downstream: n[Downstream].Load()}
	}
	return out
}

// ErrClosed is returned by operations on a closed Proxy.
var ErrClosed = errors.New("proxy: closed")

// Listen starts a proxy on 127.0.0.1 (port 0 picks a free one).
func Listen(port int, cfg Config) (*Proxy, error) {
	return listen("tcp", fmt.Sprintf("127.0.0.1:%d", port), cfg)
}

// ListenUnix starts a proxy on a unix socket at path, as a member that
// serves clients on a local socket would (etcd's unix:// client URLs).
// Close removes the socket file.
func ListenUnix(path string, cfg Config) (*Proxy, error) {
	return listen("unix", path, cfg)
}

func listen(network, addr string, cfg Config) (*Proxy, error) {
	if cfg.Target == "" {
		return nil, errors.New("proxy: empty target")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("proxy: listen: %w", err)
	}
	p := &Proxy{cfg: cfg, ln: ln, flows: map[*flow]struct{}{}, forwarded: map[string]*byteCounts{}}
	p.wg.Go(p.acceptLoop)
	return p, nil
}

// Addr returns the listening address: 127.0.0.1:port, or a unix socket's
// path.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for f := range p.flows {
		f.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// DropConnections closes every live connection (the listener stays), as a
// crashed peer's kernel would reset them.
func (p *Proxy) DropConnections() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for f := range p.flows {
		f.close()
	}
}

// Recheck resets every live connection whose link now says Reset, idle or
// not. Chunks in flight see a change of Shape's answers without it; call it
// after such a change so that connections nobody writes to follow too.
// A connection accepted while Recheck runs is checked by the proxy itself
// after its key is known, so none slips between the two.
func (p *Proxy) Recheck() {
	p.mu.Lock()
	var known []*flow
	for f := range p.flows {
		if f.identified && !f.reset {
			known = append(known, f)
		}
	}
	p.mu.Unlock()
	// Shape is called outside the lock; a key never changes once set.
	for _, f := range known {
		if p.resets(f.key) {
			p.reset(f)
		}
	}
}

// resets reports whether a connection with key is to be reset now.
func (p *Proxy) resets(key string) bool {
	return p.shape(key, Upstream).Reset || p.shape(key, Downstream).Reset
}

// reset resets both sides of f: SO_LINGER 0 makes Close send an RST.
func (p *Proxy) reset(f *flow) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, live := p.flows[f]; !live || f.reset {
		return
	}
	f.reset = true
	for _, c := range []net.Conn{f.down, f.up} {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
	}
	f.close()
}

func (f *flow) close() {
	f.closed.Store(true)
	f.down.Close()
	if f.up != nil {
		f.up.Close()
	}
}

// add registers a newly accepted connection; false (and the connection
// closed) when the proxy is closed.
func (p *Proxy) add(f *flow) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		f.down.Close()
		return false
	}
	p.flows[f] = struct{}{}
	return true
}

func (p *Proxy) remove(f *flow) {
	p.mu.Lock()
	delete(p.flows, f)
	p.mu.Unlock()
	f.close()
}

// identified records f's key and returns the counts its bytes add to.
func (p *Proxy) identified(f *flow, key string) *byteCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	f.key, f.identified = key, true
	n := p.forwarded[key]
	if n == nil {
		n = new(byteCounts)
		p.forwarded[key] = n
	}
	return n
}

// dialled attaches the connection to the target; false (and up closed)
// when f was reset or the proxy closed meanwhile.
func (p *Proxy) dialled(f *flow, up net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || f.reset {
		up.Close()
		return false
	}
	f.up = up
	return true
}

func (p *Proxy) acceptLoop() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		f := &flow{down: c}
		if !p.add(f) {
			return
		}
		p.accepted.Add(1)
		p.wg.Go(func() { p.serve(f) })
	}
}

func (p *Proxy) serve(f *flow) {
	defer p.remove(f)
	key, first, err := p.identify(f.down)
	if err != nil {
		return
	}
	// Known before checked: a Recheck that misses f (not yet identified)
	// ran before this check, which then sees the shaping it applied.
	counts := p.identified(f, key)
	if p.resets(key) {
		p.reset(f)
		return
	}
	up, err := p.dialTarget()
	if err != nil {
		return
	}
	if !p.dialled(f, up) {
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(up, f.down, f, key, Upstream, first, &counts[Upstream]) })
	wg.Go(func() { p.pipe(f.down, up, f, key, Downstream, nil, &counts[Downstream]) })
	wg.Wait()
}

// dialTarget connects to the target, retrying for Config.DialRetry: the
// dialer already holds an accepted connection, so a refusal that a direct
// dial would have seen (and retried) must not look like a dropped link.
func (p *Proxy) dialTarget() (net.Conn, error) {
	deadline := time.Now().Add(p.cfg.DialRetry)
	wait := 5 * time.Millisecond
	for {
		up, err := net.DialTimeout("tcp", p.cfg.Target, 5*time.Second)
		if err == nil || time.Now().Add(wait).After(deadline) {
			return up, err
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// identify reads the dialer's first bytes until Identify is satisfied.
func (p *Proxy) identify(c net.Conn) (string, []byte, error) {
	if p.cfg.Identify == nil {
		return "", nil, nil
	}
	var buf []byte
	chunk := make([]byte, 4096)
	for {
		n, err := c.Read(chunk)
		buf = append(buf, chunk[:n]...)
		key, more := p.cfg.Identify(buf)
		if !more || len(buf) >= 16<<10 {
			return key, buf, nil
		}
		if err != nil {
			return "", nil, err
		}
	}
}

type chunk struct {
	data []byte
	buf  *[]byte // pooled backing array of data, nil if not pooled
	due  int64   // CLOCK_MONOTONIC nanoseconds
	// after, when set, runs once the chunk is written (ResetAfterReply).
	after func()
}

// chunkSize is the most one read takes; buffers are pooled because a
// fresh 32 KiB per read made the proxy spend a third of its time in the
// allocator and the garbage collector.
const chunkSize = 32 << 10

var buffers = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// pipe copies src to dst, delaying each chunk by the link's shaping, and
// adds the bytes written to dst to forwarded.
func (p *Proxy) pipe(dst, src net.Conn, f *flow, key string, dir Direction, first []byte, forwarded *atomic.Uint64) {
	queue := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.writeLoop(dst, queue, forwarded)
	}()
	defer func() {
		close(queue)
		<-done
		// Half-close so the peer sees EOF once queued bytes are out.
		if hc, ok := dst.(interface{ CloseWrite() error }); ok { // TCP and unix
			hc.CloseWrite()
		}
	}()

	var last int64
	replied := false // a downstream chunk has gone out
	enqueue := func(b []byte, buf *[]byte) bool {
		link := p.shape(key, dir)
		if link.Reset {
			if buf != nil {
				buffers.Put(buf)
			}
			p.reset(f)
			return false
		}
		if link.Blackhole {
			if buf != nil {
				buffers.Put(buf)
			}
			return true
		}
		for link.Stall && !link.Reset && !link.Blackhole {
			// Hold this chunk, and by not reading, everything behind it.
			select {
			case <-done:
				return false
			case <-time.After(5 * time.Millisecond):
			}
			if f.closed.Load() {
				return false
			}
			link = p.shape(key, dir)
		}
		if link.Reset {
			if buf != nil {
				buffers.Put(buf)
			}
			p.reset(f)
			return false
		}
		now := monotonicNow()
		d := link.Delay
		if link.Jitter > 0 {
			d += time.Duration(rand.Int64N(int64(2*link.Jitter)+1)) - link.Jitter
		}
		due := max(now+int64(max(d, 0)), last)
		last = due
		c := chunk{data: b, buf: buf, due: due}
		if dir == Downstream && link.ResetAfterReply && !replied {
			c.after = func() { p.reset(f) }
		}
		replied = replied || dir == Downstream
		select {
		case queue <- c:
			return true
		case <-done:
			return false
		}
	}
	if len(first) > 0 && !enqueue(first, nil) {
		return
	}
	for {
		buf := buffers.Get().(*[]byte)
		n, err := src.Read(*buf)
		if n > 0 {
			if !enqueue((*buf)[:n], buf) {
				return
			}
		} else {
			buffers.Put(buf)
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) shape(key string, dir Direction) Link {
	if p.cfg.Shape == nil {
		return Link{}
	}
	return p.cfg.Shape(key, dir)
}

func (p *Proxy) writeLoop(dst net.Conn, queue <-chan chunk, forwarded *atomic.Uint64) {
	t, err := newTimer()
	if err != nil {
		// Without a timerfd, fall back to Go's timers: coarser, still correct.
		t = nil
	} else {
		defer t.close()
	}
	failed := false
	var next *chunk // taken from the queue but not yet due
	batch := make([]chunk, 0, 64)
	for {
		var c chunk
		if next != nil {
			c, next = *next, nil
		} else {
			var ok bool
			if c, ok = <-queue; !ok {
				return
			}
		}
		if failed {
			release(c)
			continue // drain so the reader never blocks
		}
		if wait := c.due - monotonicNow(); wait > 0 {
			if t != nil {
				t.sleepUntil(c.due)
			} else {
				time.Sleep(time.Duration(wait))
			}
		}
		// Send every chunk already due in one writev: small raft messages
		// often fall due together, and each loopback write is costly.
		batch = append(batch[:0], c)
		now := monotonicNow()
	collect:
		for len(batch) < cap(batch) {
			select {
			case more, ok := <-queue:
				if !ok {
					break collect
				}
				if more.due > now {
					next = &more
					break collect
				}
				batch = append(batch, more)
			default:
				break collect
			}
		}
		bufs := make(net.Buffers, len(batch))
		for i, b := range batch {
			bufs[i] = b.data
		}
		// One add per batch; a failed write counts what it did write.
		n, err := bufs.WriteTo(dst)
		forwarded.Add(uint64(n))
		if err != nil {
			failed = true
			dst.Close()
		}
		for _, b := range batch {
			release(b)
			if b.after != nil && !failed {
				b.after()
			}
		}
	}
}

func release(c chunk) {
	if c.buf != nil {
		buffers.Put(c.buf)
	}
}

func monotonicNow() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// timer sleeps until an absolute CLOCK_MONOTONIC time on a timerfd, parking
// the goroutine in the runtime poller rather than on a Go timer.
type timer struct {
	fd int
	f  *os.File
}

func newTimer() (*timer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("timerfd_create: %w", err)
	}
	// A non-blocking fd handed to os.NewFile is registered with the poller.
	return &timer{fd: fd, f: os.NewFile(uintptr(fd), "timerfd")}, nil
}

func (t *timer) sleepUntil(due int64) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(due)}
	if err := unix.TimerfdSettime(t.fd, unix.TFD_TIMER_ABSTIME, &spec, nil); err != nil {
		time.Sleep(time.Duration(due - monotonicNow()))
		return
	}
	var buf [8]byte
	if _, err := io.ReadFull(t.f, buf[:]); err != nil {
		time.Sleep(time.Duration(due - monotonicNow()))
	}
}

func (t *timer) close() { t.f.Close() }

// HeaderKey returns an Identify function that keys a connection by the
// value of an HTTP request header (e.g. etcd's X-Server-From); connections
// without it get the key "".
func HeaderKey(name string) func([]byte) (string, bool) {
	needle := []byte("\r\n" + name + ":")
	return func(b []byte) (string, bool) {
		end := bytes.Index(b, []byte("\r\n\r\n"))
		if end < 0 {
			// Not an HTTP request head (yet): wait for more only if it
			// starts like one.
			return "", looksLikeHTTP(b)
		}
		head := b[:end+2]
		i := bytes.Index(bytes.ToLower(head), bytes.ToLower(needle))
		if i < 0 {
			return "", false
		}
		v := head[i+len(needle):]
		v = v[:bytes.Index(v, []byte("\r\n"))]
		return string(bytes.TrimSpace(v)), false
	}
}

func looksLikeHTTP(b []byte) bool {
	for _, m := range []string{"GET ", "POST ", "PUT ", "HEAD ", "DELETE "} {
		n := min(len(b), len(m))
		if n > 0 && string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}
