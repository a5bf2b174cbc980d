package sim

import (
	"time"

	"github.com/oproute/oproute/router"
)

// readBatch is a member's read-index requests under Cluster.BatchReads,
// kept as etcd's linearizable read loop keeps them: one request out at a
// time, for the reads that came before it was sent; the reads that come
// while it is out wait for the next, sent when its answer comes.
type readBatch struct {
	waiting, out []waiter // for the next request; in the one out
	busy         bool     // a request is out
	// gen counts the sendings (a request is sent again when unanswered:
	// readIndexRetry); first is the current request's first. Events of
	// any sending of the current request count, as etcd takes whichever
	// answer comes first; an earlier request's lapse.
	gen, first uint32
	term       uint64 // the leader's term when it was sent
	acked      []bool // the followers that confirmed it, by member index
	acks       int    // how many
	answered   bool   // the leader has answered it
}

// waiter is a worker's read waiting on a read index.
type waiter struct {
	k   int32
	gen uint32
}

// batchCosts are the jobs of a request of member i's: the leader's to take
// it and the member's to take its answer (none for the leader's own), and
// each follower's to confirm it (ConfirmReads). A batch of one costs what
// an unbatched read's read index does.
func (s *world) batchCosts(i int) (index, confirm, reply time.Duration) {
	c := s.cl.Costs
	if i != s.leader {
		index, reply = c.ReadIndex+c.Message, c.Message
	}
	if s.cl.ConfirmReads {
		confirm = c.Message
	}
	return index, confirm, reply
}

// join puts worker k's read into member i's next request, sending it at
// once when none is out.
func (s *world) join(k int, o *operation, i int) {
	b := &s.batches[i]
	b.waiting = append(b.waiting, waiter{k: int32(k), gen: o.gen})
	if !b.busy {
		s.sendBatch(i)
	}
}

// readIndexRetry is how long a member waits for the answer to a
// read-index request before it sends the request again (etcd's
// readIndexRetryTime): a leader whose confirmation found no quorum answers
// a later one.
const readIndexRetry = 500 * time.Millisecond

// sendBatch sends member i's request for the reads waiting on it.
func (s *world) sendBatch(i int) {
	b := &s.batches[i]
	b.out, b.waiting = b.waiting, b.out[:0]
	b.first, b.acks, b.answered = b.gen+1, 0, false
	if b.acked == nil {
		b.acked = make([]bool, len(s.cl.Members))
	}
	clear(b.acked)
	s.ask(i)
}

// ask sends member i's request (again, on a retry), an earlier sending's
// events lapsing.
func (s *world) ask(i int) {
	b := &s.batches[i]
	b.gen++
	b.term = s.term
	if s.leader < 0 {
		s.dropBatch(i, i) // no leader to ask
		return
	}
	b.busy = true
	s.used.requests[i]++
	s.at(s.now+readIndexRetry, event{worker: int32(i), kind: batchRetry, gen: b.gen})
	if i != s.leader {
		s.at(s.now+s.hop(i, s.leader), event{worker: int32(i), kind: batchArrive, gen: b.gen})
		return
	}
	s.confirmBatch(i)
}

// confirmBatch has the leader confirm its leadership for member i's
// request with a round to every follower (ConfirmReads), or answer it.
func (s *world) confirmBatch(i int) {
	if !s.cl.ConfirmReads || s.quorum == 0 {
		s.answerBatch(i)
		return
	}
	b := &s.batches[i]
	_, cost, _ := s.batchCosts(i)
	for _, f := range s.followers {
		s.at(s.now+s.hop(s.leader, f), event{worker: int32(i), member: int16(f), kind: batchFanArrive, cost: cost, gen: b.gen})
	}
}

// answerBatch sends the read index back to member i; the leader's own
// reads go on at once.
func (s *world) answerBatch(i int) {
	s.batches[i].answered = true
	if i == s.leader {
		s.releaseBatch(i)
		return
	}
	s.at(s.now+s.hop(s.leader, i), event{worker: int32(i), kind: batchReply, gen: s.batches[i].gen})
}

// releaseBatch lets the reads of member i's answered request go on, and
// sends the next request if reads are waiting.
func (s *world) releaseBatch(i int) {
	b := &s.batches[i]
	b.busy = false
	for _, w := range b.out {
		if o := &s.ops[w.k]; o.live && o.gen == w.gen { // else failed or given up on meanwhile
			o.stage++
			s.next(int(w.k), o) // a read is served after its read index: never its last step
		}
	}
	b.out = b.out[:0]
	if len(b.waiting) > 0 {
		s.sendBatch(i)
	}
}

// dropBatch fails every read of member i's batch, the error coming from
// member from (i itself, or a killed leader) through i to each client, and
// ends its request.
func (s *world) dropBatch(i, from int) {
	b := &s.batches[i]
	for _, ws := range [2][]waiter{b.out, b.waiting} {
		for _, w := range ws {
			if o := &s.ops[w.k]; o.live && o.gen == w.gen {
				back := s.hop(i, client)
				if from != i {
					back += s.hop(from, i)
				}
				s.fail(int(w.k), o, s.now+back, router.MemberFault)
			}
		}
	}
	b.out, b.waiting = b.out[:0], b.waiting[:0]
	b.busy = false
	b.gen++
}

// killBatches: member m is killed. Its own reads were reset with it; if
// it led, every member's reads on a read index fail back.
func (s *world) killBatches(m int) {
	if !s.cl.BatchReads {
		return
	}
	for i := range s.batches {
		if i == m || m == s.leader {
			s.dropBatch(i, m)
		}
	}
}

// handleBatch runs event e of member e.worker's batch.
func (s *world) handleBatch(e event) {
	i := int(e.worker)
	b := &s.batches[i]
	switch e.kind {
	case batchFanArrive: // an earlier request's confirmation costs its follower all the same
		s.fanJob(e, batchAckArrive, batchFanAck)
		return
	case batchAckArrive:
		s.ackJob(e, batchFanAck)
		return
	}
	if !b.busy || e.gen < b.first {
		return // an earlier request's
	}
	if s.leader < 0 || b.term != s.term {
		s.dropBatch(i, i) // sent to a leader since deposed (a kill drops its batches first)
		return
	}
	switch e.kind {
	case batchRetry:
		if e.gen == b.gen && !b.answered {
			s.ask(i) // no answer to its latest sending yet: send it again
		}
	case batchArrive:
		index, _, _ := s.batchCosts(i)
		s.at(s.job(s.leader, index), event{worker: e.worker, kind: batchIndexed, gen: e.gen})
	case batchIndexed:
		s.confirmBatch(i)
	case batchFanAck:
		if b.answered || b.acked[e.member] || s.down[e.member] {
			return // past the quorum, counted (from another sending), or lost with the follower's queued work
		}
		b.acked[e.member] = true
		if b.acks++; b.acks == s.quorum {
			s.answerBatch(i)
		}
	case batchReply:
		_, _, reply := s.batchCosts(i)
		s.at(s.job(i, reply), event{worker: e.worker, kind: batchRelease, gen: e.gen})
	case batchRelease:
		s.releaseBatch(i)
	}
}
