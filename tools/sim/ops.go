package sim

import (
	"time"

	"github.com/oproute/oproute/router"
)

// An operation is a worker's current call: a path of steps taken in turn,
// each started when the one before it ends (advance).
type operation struct {
	p       router.Pick
	op      router.Op
	sent    time.Duration
	path    []step
	stage   int            // the step under way
	gen     uint32         // counts the worker's operations and fan-outs: a late acknowledgement is an earlier one's
	acks    int            // of the fan-out under way
	slot    time.Duration  // a paced worker's next start
	id      uint32         // counts the worker's operations, for their deadlines
	live    bool           // placed and not ended
	armed   bool           // the worker's deadline event is queued
	outcome router.Outcome // how it ended
	term    uint64         // the leader's term at its placement, and who led
	leader  int
}

// stepKind is what a step does.
type stepKind uint8

const (
	message stepKind = iota // a message from src to dst, then, if job, a job there
	fanOut                  // the leader's message to every follower, each a job there; the step ends at a quorum of acknowledgements
	work                    // a job at dst, no message
	batched                 // the read waits on dst's read-index request (Cluster.BatchReads)
)

// step is one leg of an operation's path. src and dst are member indexes,
// or client.
type step struct {
	kind     stepKind
	src, dst int
	job      bool          // a message step's CPU job at dst
	cost     time.Duration // that job's, or each follower's in a fan-out
}

// client stands for the client in a step's ends.
const client = -1

// kib is n bytes in KiB.
func kib(n int) float64 { return float64(n) / 1024 }

// buildPaths are each placement's steps under the current leader, built
// at each election with its costs:
// [read or write][member]. The package's doc describes them. A message
// costs the member it reaches Costs.Message and MessagePerKiB of its size
// (ReadIndex requests, confirmations, acknowledgements and replies to a
// write carry no payload); serving a read costs PerKiB of its response,
// taking a write or appending it PerKiB of its value.
func (s *world) buildPaths(w Workload) [2][][]step {
	L, c := s.leader, s.cl.Costs
	resp := max(w.RangeSize, 1) * w.ValueSize
	perKiB := func(n int) time.Duration { return time.Duration(kib(n) * float64(c.PerKiB)) }
	recv := func(n int) time.Duration { return c.Message + time.Duration(kib(n)*float64(c.MessagePerKiB)) }
	// msg is a message of n bytes from src to dst, with a job of cost
	// there (job: even if it costs nothing, it waits its turn).
	msg := func(src, dst, n int, job bool, cost time.Duration) step {
		if dst != client {
			cost += recv(n)
			job = job || cost > 0
		}
		return step{kind: message, src: src, dst: dst, job: job, cost: cost}
	}
	var confirm []step
	if s.cl.ConfirmReads {
		confirm = []step{{kind: fanOut, src: L, cost: recv(0)}}
	}
	commit := step{kind: fanOut, src: L, cost: c.Append + perKiB(w.ValueSize) + recv(w.ValueSize)}
	var out [2][][]step
	for i := range s.cl.Members {
		var read, wr []step
		switch serve := c.FollowerRead; {
		case s.cl.BatchReads:
			if i == L {
				serve = c.LeaderRead
			}
			read = []step{msg(client, i, 0, true, 0), {kind: batched, src: i, dst: i},
				{kind: work, src: i, dst: i, job: true, cost: serve + perKiB(resp)}, msg(i, client, resp, false, 0)}
		case i == L:
			read = append(append([]step{msg(client, L, 0, true, c.LeaderRead+perKiB(resp))}, confirm...), msg(L, client, resp, false, 0))
		default:
			read = append(append([]step{msg(client, i, 0, true, 0), msg(i, L, 0, true, c.ReadIndex)}, confirm...),
				msg(L, i, 0, true, c.FollowerRead+perKiB(resp)), msg(i, client, resp, false, 0))
		}
		if i == L {
			wr = []step{msg(client, L, w.ValueSize, true, c.Write+perKiB(w.ValueSize)), commit, msg(L, client, 0, false, 0)}
		} else {
			wr = []step{msg(client, i, w.ValueSize, true, c.Forward), msg(i, L, w.ValueSize, true, c.Write+perKiB(w.ValueSize)), commit,
				msg(L, i, 0, false, 0), msg(i, client, 0, false, 0)}
		}
		out[0] = append(out[0], read)
		out[1] = append(out[1], wr)
	}
	return out
}

// advance starts worker k's operation's current step at the current
// time; false when the operation has no step left.
func (s *world) advance(k int, o *operation) bool {
	for o.stage < len(o.path) {
		st := o.path[o.stage]
		switch st.kind {
		case message:
			kind := stepDone
			if st.job {
				kind = arrive
			}
			s.at(s.now+s.hop(st.src, st.dst), event{worker: int32(k), kind: kind, gen: o.gen})
			return true
		case work:
			s.at(s.now, event{worker: int32(k), kind: arrive, gen: o.gen})
			return true
		case batched:
			s.join(k, o, st.dst)
			return true
		}
		if s.quorum == 0 { // a single member commits alone
			o.stage++
			continue
		}
		o.acks = 0
		o.gen++ // a late acknowledgement of an earlier fan-out counts for nothing
		for _, f := range s.followers {
			s.at(s.now+s.hop(st.src, f), event{worker: int32(k), member: int16(f), kind: fanArrive, cost: st.cost, gen: o.gen})
		}
		return true
	}
	return false
}

// deposed reports that step st of o, placed under a leader since deposed,
// needs that leader: it refuses (it leads no more, or is down).
func (s *world) deposed(o *operation, st step) bool {
	return o.term != s.term && (st.kind == fanOut || st.src == o.leader || st.dst == o.leader)
}

// fail ends worker k's operation at t with outcome: its events under
// way are left to lapse, and its path is dropped (a kill skips it).
func (s *world) fail(k int, o *operation, t time.Duration, outcome router.Outcome) {
	o.gen++
	o.path = nil
	s.at(t, event{worker: int32(k), kind: failed, member: int16(outcome), gen: o.gen})
}

// refused ends worker k's operation whose current step found its member
// killed: the sender learns it in a one-way trip and tells the client.
func (s *world) refused(k int, o *operation) {
	st := o.path[o.stage]
	t := s.now + s.hop(st.dst, st.src)
	if st.src != client {
		t += s.hop(st.src, client)
	}
	s.fail(k, o, t, router.MemberFault)
}

// handle runs event e of worker k's operation; true when the operation
// ended with it (its outcome in o.outcome).
func (s *world) handle(e event, k int, o *operation) bool {
	switch e.kind {
	case arrive:
		if e.gen != o.gen {
			return false // a failed or abandoned operation's
		}
		st := o.path[o.stage]
		if s.down[st.dst] || s.deposed(o, st) {
			s.refused(k, o)
			return false
		}
		s.at(s.job(st.dst, st.cost), event{worker: e.worker, kind: stepDone, gen: e.gen})
	case fanArrive: // an earlier operation's fan-out costs its follower all the same
		s.fanJob(e, ackArrive, fanAck)
	case ackArrive:
		s.ackJob(e, fanAck)
	case fanAck:
		if e.gen != o.gen || o.acks == s.quorum || s.down[e.member] {
			return false // an earlier operation's, past the quorum, or lost with the follower's queued work
		}
		if o.acks++; o.acks == s.quorum {
			o.stage++
			return s.next(k, o)
		}
	case stepDone:
		if e.gen != o.gen {
			return false
		}
		if st := o.path[o.stage]; st.dst != client && s.down[st.dst] {
			s.refused(k, o) // killed while it held the work or before its message came
			return false
		}
		o.stage++
		if o.stage < len(o.path) && s.deposed(o, o.path[o.stage]) {
			s.refused(k, o)
			return false
		}
		return s.next(k, o)
	case failed:
		if e.gen != o.gen || !o.live {
			return false
		}
		o.outcome = router.Outcome(e.member)
		return true
	case deadline:
		switch {
		case !o.live:
			o.armed = false
		case e.gen != o.id: // a later operation: wait for its own deadline
			s.at(o.sent+s.timeout, event{worker: e.worker, kind: deadline, gen: o.id})
		default:
			o.armed = false
			o.gen++ // its events under way lapse
			o.outcome = router.CallerGaveUp
			return true
		}
	}
	return false
}

// next starts the operation's next step; true when it had none left, and
// so succeeded.
func (s *world) next(k int, o *operation) bool {
	if s.advance(k, o) {
		return false
	}
	o.outcome = router.OK
	return true
}

// fanJob runs a fan-out's job at follower e.member and sends its
// acknowledgement to the leader: as arrive, for the leader to take in
// turn, when acknowledgements cost it CPU, else as ack. A follower down,
// or no leader, acknowledges nothing.
func (s *world) fanJob(e event, arrive, ack eventKind) {
	f := int(e.member)
	if s.down[f] || s.leader < 0 {
		return
	}
	end := s.job(f, e.cost)
	e.kind = ack
	if s.ackCost > 0 {
		e.kind = arrive
	}
	s.at(end+s.hop(f, s.leader), e)
}

// ackJob has the leader take acknowledgement e in turn, then counts it
// (as ack); lost with the leader, or with the follower's queued work.
func (s *world) ackJob(e event, ack eventKind) {
	if s.leader < 0 || s.down[e.member] {
		return
	}
	e.kind = ack
	s.at(s.job(s.leader, s.ackCost), e)
}
