package conformance

import (
	"math"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// History records puts and gets of string registers from concurrent
// clients, for a linearizability check with porcupine. A put that failed
// may or may not have happened: it is recorded as never returning, so the
// checker may place it anywhere after its call. A failed get tells nothing
// and is left out. It is safe for concurrent use.
type History struct {
	start  time.Time
	mu     sync.Mutex
	ops    []porcupine.Operation
	failed int
}

// NewHistory starts an empty history; its clock starts now.
func NewHistory() *History { return NewHistoryAt(time.Now()) }

// NewHistoryAt starts an empty history whose clock started at start (to
// record an operation made before the history was).
func NewHistoryAt(start time.Time) *History { return &History{start: start} }

// Now is the history's clock, for an operation's call time.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Put records a put of value to key by client, called at call (Now), that
// returned err just now.
func (h *History) Put(client int, key, value string, call int64, err error) {
	ret := h.Now()
	if err != nil {
		ret = math.MaxInt64
	}
	h.add(porcupine.Operation{ClientId: client, Input: linInput{put: true, key: key, value: value}, Call: call, Return: ret}, err)
}

// Get records a get of key by client, called at call, that returned value
// (found false: no such key) or err just now.
func (h *History) Get(client int, key, value string, found bool, call int64, err error) {
	op := porcupine.Operation{ClientId: client, Input: linInput{key: key}, Output: linOutput{value, found}, Call: call, Return: h.Now()}
	h.add(op, err)
}

func (h *History) add(op porcupine.Operation, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.failed++
		if !op.Input.(linInput).put {
			return
		}
	}
	h.ops = append(h.ops, op)
}

// Len returns how many operations are recorded; Failed how many failed
// (failed gets are not recorded).
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// Failed returns how many operations failed.
func (h *History) Failed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed
}

// Check runs porcupine on the history, for at most timeout. It returns
// porcupine.Ok, Illegal, or Unknown when it ran out of time, and for an
// illegal history the length of the longest partial linearization.
func (h *History) Check(timeout time.Duration) (porcupine.CheckResult, int) {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	res, info := porcupine.CheckOperationsVerbose(registerModel, ops, timeout)
	longest := 0
	if res == porcupine.Illegal {
		for _, part := range info.PartialLinearizationsOperations() {
			if len(part) > 0 {
				longest = max(longest, len(part[0]))
			}
		}
	}
	return res, longest
}
