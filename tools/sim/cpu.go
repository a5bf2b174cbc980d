package sim

import (
	"fmt"
	"math"
	"time"
)

// OperationCPU is the CPU time one operation costs each member in the
// model, on cluster cl under its first leader: a write (else a
// linearizable read) of workload w's sizes placed on member at, with every
// step's job, each follower's part of a fan-out and the leader's
// acknowledgements counted, and CV's noise left out. It is what the test
// bed's costs scenario measures per operation, so costs can be fitted to
// it (package bench's SimCostsFrom) and checked.
func (cl Cluster) OperationCPU(write bool, at int, w Workload) ([]time.Duration, error) {
	return cl.OperationCPUBatched(write, at, w, 1)
}

// OperationCPUBatched is OperationCPU with a read's read index asked for
// in a request shared by reads reads (at least 1): the request's jobs,
// its messages and its confirmation included, are split among them. The
// rest of the operation is its own. Without Cluster.BatchReads, and for
// a write, reads changes nothing.
func (cl Cluster) OperationCPUBatched(write bool, at int, w Workload, reads float64) ([]time.Duration, error) {
	n := len(cl.Members)
	if reads < 1 || math.IsNaN(reads) {
		return nil, fmt.Errorf("%w: %v reads a read-index request", ErrBadLoad, reads)
	}
	switch {
	case n == 0:
		return nil, ErrNoMembers
	case cl.Leader < 0 || cl.Leader >= n || at < 0 || at >= n:
		return nil, fmt.Errorf("%w: leader %d, placed on %d, of %d", ErrBadMember, cl.Leader, at, n)
	}
	s := newWorld(cl, 0)
	s.workload, s.ackCost = w, cl.Costs.Message
	s.lead(cl.Leader)
	kind := 0
	if write {
		kind = 1
	}
	out := make([]time.Duration, n)
	for _, st := range s.paths[kind][at] {
		switch {
		case st.kind == batched:
			share := func(d time.Duration) time.Duration { return time.Duration(float64(d) / reads) }
			index, confirm, reply := s.batchCosts(st.dst)
			out[s.leader] += share(index)
			out[st.dst] += share(reply)
			if confirm > 0 {
				for _, f := range s.followers {
					out[f] += share(confirm)
					out[s.leader] += share(s.ackCost)
				}
			}
		case st.kind == fanOut:
			for _, f := range s.followers {
				out[f] += st.cost
				out[s.leader] += s.ackCost
			}
		case st.job && st.dst != client:
			out[st.dst] += st.cost
		}
	}
	return out, nil
}
