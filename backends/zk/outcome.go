package zk

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/oproute/oproute/router"
)

// outcomes is the backend's one table from go-zookeeper's error values to
// what they say about the server that served the call. Errors not in it
// (go-zookeeper turns server codes it does not know, such as operation
// timeout, into plain "unknown error: N" values) are member faults.
var outcomes = map[error]router.Outcome{
	// The server did not serve the call: the connection broke or never
	// came up, the session is on another server now, or it is gone.
	zk.ErrConnectionClosed: router.MemberFault,
	zk.ErrNoServer:         router.MemberFault,
	zk.ErrSessionMoved:     router.MemberFault,
	zk.ErrSessionExpired:   router.MemberFault,
	zk.ErrClosing:          router.MemberFault,
	zk.ErrUnknown:          router.MemberFault, // ZooKeeper's system error
	// ZooKeeper's answer on the call's merits: the server works.
	zk.ErrNoNode:                  router.AppError,
	zk.ErrNodeExists:              router.AppError,
	zk.ErrNotEmpty:                router.AppError,
	zk.ErrBadVersion:              router.AppError,
	zk.ErrNoChildrenForEphemerals: router.AppError,
	zk.ErrNoAuth:                  router.AppError,
	zk.ErrAuthFailed:              router.AppError,
	zk.ErrInvalidACL:              router.AppError,
	zk.ErrInvalidFlags:            router.AppError,
	zk.ErrInvalidPath:             router.AppError,
	zk.ErrBadArguments:            router.AppError,
	zk.ErrAPIError:                router.AppError,
	zk.ErrNothing:                 router.AppError,
	zk.ErrReconfigDisabled:        router.AppError,
	ErrMultiRolledBack:            router.AppError,
}

// outcomeOf maps how a call on ctx ended to the router's outcome. The
// caller's own deadline or cancel comes first: it is not the server's
// fault, whatever error it left behind.
func outcomeOf(ctx context.Context, err error) router.Outcome {
	switch {
	case err == nil:
		return router.OK
	case ctx.Err() != nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return router.CallerGaveUp
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if o, ok := outcomes[e]; ok {
			return o
		}
		var code int
		if n, _ := fmt.Sscanf(e.Error(), "unknown error: %d", &code); n == 1 {
			if o, ok := codeOutcomes[code]; ok {
				return o
			}
		}
	}
	return router.MemberFault
}

// codeOutcomes maps the ZooKeeper error codes go-zookeeper has no value for
// (it reports them as "unknown error: N", the only form in which they reach
// us) that are not the server's fault; the others (system error, operation
// or request timeout, connection loss, unknown session) are member faults.
var codeOutcomes = map[int]router.Outcome{
	-127: router.Overloaded, // throttled: the server sheds load
	-2:   router.AppError,   // runtime inconsistency: a Multi op rolled back
	-5:   router.AppError,   // marshalling error: the request
	-6:   router.AppError,   // unimplemented: the server does not offer it
	-13:  router.AppError,   // no quorum of a new configuration is up to date: the ensemble's state
	-14:  router.AppError,   // reconfiguration in progress
	-119: router.AppError,   // not read-only
	-120: router.AppError,   // ephemeral on a local session
	-121: router.AppError,   // no watcher
	-124: router.AppError,   // session closed, SASL required
	-125: router.AppError,   // quota exceeded
}

// isMemberFault reports whether err says the server did not serve the call
// (the request may not have reached it, or its answer was lost).
func isMemberFault(err error) bool {
	return err != nil && outcomeOf(context.Background(), err) == router.MemberFault
}
