package sim

import "time"

// eventKind is what an event does to its worker's operation.
type eventKind uint8

const (
	arrive    eventKind = iota // the step's message reaches its member: its job there
	stepDone                   // the step ends
	fanArrive                  // a fan-out's message reaches a follower: its job there
	ackArrive                  // that follower's acknowledgement reaches the leader: its job there (Costs.Message)
	fanAck                     // the leader has taken that acknowledgement
	tick                       // client worker's router's round is due
	start                      // a paced worker's slot: it starts its next operation
	failed                     // the operation's error reaches its worker (member: the outcome)
	deadline                   // the worker gives up on the operation (gen: its id)
	election                   // a majority elects a leader
	// A member's batch of read indexes (Cluster.BatchReads; worker: the
	// member, gen: the batch's). They stay last: the run's loop tells
	// them by kind >= batchArrive.
	batchArrive    // its request reaches the leader: the leader's job
	batchIndexed   // the leader has taken it: it confirms, or answers
	batchFanArrive // the leader's confirmation reaches a follower (member): its job there
	batchAckArrive // that follower's acknowledgement reaches the leader: its job there
	batchFanAck    // the leader has taken that acknowledgement
	batchReply     // the read index reaches the member: its job there
	batchRelease   // the member has taken it: its reads go on
	batchRetry     // no answer yet: the member sends its request again
)

// event is a worker's operation's next move, due at a virtual time.
type event struct {
	at     time.Duration
	seq    uint64        // ties in order of scheduling, for determinism
	cost   time.Duration // a fan-out's job
	worker int32         // or the client, for a tick
	member int16         // a fan-out's follower
	kind   eventKind
	gen    uint32 // the worker's operation it belongs to
}

// events is a binary min-heap on (at, seq): no interface, no allocation
// once grown.
type events []event

func (q events) less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}

func (q *events) push(e event) {
	*q = append(*q, e)
	h := *q
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

func (q *events) pop() event {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, least := 2*i+1, 2*i+2, i
		if l < len(h) && h.less(l, least) {
			least = l
		}
		if r < len(h) && h.less(r, least) {
			least = r
		}
		if least == i {
			break
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
	*q = h
	return top
}

// at schedules e at t.
func (s *world) at(t time.Duration, e event) {
	s.seq++
	e.at, e.seq = t, s.seq
	s.queue.push(e)
}
