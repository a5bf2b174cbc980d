package etcd

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/router"
)

// outcomeOf is the one place where the etcd backend maps how a call ended
// to a router.Outcome. It goes by value and code and holds no message text
// of its own: etcd's errors by their rpctypes value (etcdOutcomes, matched
// the way clientv3 matches them, see byEtcdError), the rest by gRPC code
// (codeOutcomes). ctx is the call's context, as the picker got it.
//
// What grpc-go (v1.83) puts in the DoneInfo of a call that never left:
//
//   - The picker chose a SubConn whose transport is no longer ready
//     (picker_wrapper.go): Done(DoneInfo{}): Err nil, BytesSent and
//     BytesReceived false. gRPC then picks again. This is not a success:
//     a call that ran always has BytesSent set, so it is NotSent.
//   - The transport refused the new stream (csAttempt.newStream fails:
//     connection closing or draining after a GOAWAY, the caller's ctx
//     ended while waiting for stream quota, headers too large): the
//     attempt finishes with that error and no stream, so BytesSent and
//     BytesReceived are false. Closing and draining are codes.Unavailable
//     and gRPC retries them transparently on a new pick: NotSent.
//
// BytesSent is really "a stream was created on the transport" (stream.go:
// BytesSent: a.transportStream != nil); the headers may still have been
// queued rather than written. BytesReceived is set once the server's
// headers or data arrived.
func outcomeOf(ctx context.Context, di balancer.DoneInfo) router.Outcome {
	err := di.Err
	sent := di.BytesSent || di.BytesReceived
	if err == nil {
		if !sent {
			return router.NotSent // the picked transport was not ready
		}
		return router.OK
	}
	code := codeOf(err)
	if ctx.Err() != nil || code == codes.Canceled {
		return router.CallerGaveUp
	}
	if !sent && code == codes.Unavailable {
		return router.NotSent
	}
	if out, ok := etcdOutcome(err); ok {
		return out
	}
	if out, ok := codeOutcomes[code]; ok {
		return out
	}
	return router.AppError
}

// etcdOutcomes classifies every server error that etcd's rpctypes defines
// (go.etcd.io/etcd/api/v3/v3rpc/rpctypes, error.go), explicitly. Its keys
// are the gRPC errors the server returns (rpctypes.ErrGRPCX); etcdOutcome
// matches a received error to them by value, not by wording.
//
//   - MemberFault: the member could not serve the call, another may. It
//     has no leader, is not the leader, saw the leader change, timed out
//     on its own side (every ErrGRPCTimeout*), is stopping, is not ready
//     (not capable: its cluster version is not yet known), is not
//     connected to a quorum (unhealthy), is a learner, is corrupt, or
//     belongs to another cluster.
//   - Overloaded: "too many requests": the member's apply loop lags its
//     commit index by more than etcd's limit.
//   - CallerGaveUp: the server saw the caller's context cancelled.
//   - AppError: the member answered and refused the request on its merits.
//     Database space exceeded (ErrGRPCNoSpace) is here too: the NOSPACE
//     alarm is cluster-wide and refuses writes on every member, which says
//     nothing about this one's health.
var etcdOutcomes = map[error]router.Outcome{
	// KV.
	rpctypes.ErrGRPCEmptyKey:                router.AppError,
	rpctypes.ErrGRPCKeyNotFound:             router.AppError,
	rpctypes.ErrGRPCValueProvided:           router.AppError,
	rpctypes.ErrGRPCLeaseProvided:           router.AppError,
	rpctypes.ErrGRPCTooManyOps:              router.AppError,
	rpctypes.ErrGRPCDuplicateKey:            router.AppError,
	rpctypes.ErrGRPCInvalidClientAPIVersion: router.AppError,
	rpctypes.ErrGRPCInvalidSortOption:       router.AppError,
	rpctypes.ErrGRPCCompacted:               router.AppError,
	rpctypes.ErrGRPCFutureRev:               router.AppError,
	rpctypes.ErrGRPCNoSpace:                 router.AppError,

	// Lease.
	rpctypes.ErrGRPCLeaseNotFound:    router.AppError,
	rpctypes.ErrGRPCLeaseExist:       router.AppError,
	rpctypes.ErrGRPCLeaseTTLTooLarge: router.AppError,

	// Watch: the server's stream context was cancelled by the caller.
	rpctypes.ErrGRPCWatchCanceled: router.CallerGaveUp,

	// Cluster.
	rpctypes.ErrGRPCMemberExist:            router.AppError,
	rpctypes.ErrGRPCPeerURLExist:           router.AppError,
	rpctypes.ErrGRPCMemberNotEnoughStarted: router.AppError,
	rpctypes.ErrGRPCMemberBadURLs:          router.AppError,
	rpctypes.ErrGRPCMemberNotFound:         router.AppError,
	rpctypes.ErrGRPCMemberNotLearner:       router.AppError,
	rpctypes.ErrGRPCLearnerNotReady:        router.AppError,
	rpctypes.ErrGRPCTooManyLearners:        router.AppError,
	rpctypes.ErrGRPCClusterIDMismatch:      router.MemberFault,

	// Requests.
	rpctypes.ErrGRPCRequestTooLarge:        router.AppError,
	rpctypes.ErrGRPCRequestTooManyRequests: router.Overloaded,

	// Auth.
	rpctypes.ErrGRPCRootUserNotExist:     router.AppError,
	rpctypes.ErrGRPCRootRoleNotExist:     router.AppError,
	rpctypes.ErrGRPCUserAlreadyExist:     router.AppError,
	rpctypes.ErrGRPCUserEmpty:            router.AppError,
	rpctypes.ErrGRPCUserNotFound:         router.AppError,
	rpctypes.ErrGRPCRoleAlreadyExist:     router.AppError,
	rpctypes.ErrGRPCRoleNotFound:         router.AppError,
	rpctypes.ErrGRPCRoleEmpty:            router.AppError,
	rpctypes.ErrGRPCAuthFailed:           router.AppError,
	rpctypes.ErrGRPCPermissionNotGiven:   router.AppError,
	rpctypes.ErrGRPCPermissionDenied:     router.AppError,
	rpctypes.ErrGRPCRoleNotGranted:       router.AppError,
	rpctypes.ErrGRPCPermissionNotGranted: router.AppError,
	rpctypes.ErrGRPCAuthNotEnabled:       router.AppError,
	rpctypes.ErrGRPCInvalidAuthToken:     router.AppError,
	rpctypes.ErrGRPCInvalidAuthMgmt:      router.AppError,
	rpctypes.ErrGRPCAuthOldRevision:      router.AppError,

	// Server state.
	rpctypes.ErrGRPCNoLeader:                   router.MemberFault,
	rpctypes.ErrGRPCNotLeader:                  router.MemberFault,
	rpctypes.ErrGRPCLeaderChanged:              router.MemberFault,
	rpctypes.ErrGRPCNotCapable:                 router.MemberFault,
	rpctypes.ErrGRPCStopped:                    router.MemberFault,
	rpctypes.ErrGRPCTimeout:                    router.MemberFault,
	rpctypes.ErrGRPCTimeoutDueToLeaderFail:     router.MemberFault,
	rpctypes.ErrGRPCTimeoutDueToConnectionLost: router.MemberFault,
	rpctypes.ErrGRPCTimeoutWaitAppliedIndex:    router.MemberFault,
	rpctypes.ErrGRPCUnhealthy:                  router.MemberFault,
	rpctypes.ErrGRPCCorrupt:                    router.MemberFault,
	rpctypes.ErrGRPCNotSupportedForLearner:     router.MemberFault,
	rpctypes.ErrGRPCBadLeaderTransferee:        router.AppError,

	// Downgrade.
	rpctypes.ErrGRPCWrongDowngradeVersionFormat:   router.AppError,
	rpctypes.ErrGRPCInvalidDowngradeTargetVersion: router.AppError,
	rpctypes.ErrGRPCClusterVersionUnavailable:     router.AppError,
	rpctypes.ErrGRPCDowngradeInProcess:            router.AppError,
	rpctypes.ErrGRPCNoInflightDowngrade:           router.AppError,

	// The server's context ended: cancelled by the caller, or its
	// deadline passed while the caller's was still live (checked first).
	rpctypes.ErrGRPCCanceled:         router.CallerGaveUp,
	rpctypes.ErrGRPCDeadlineExceeded: router.MemberFault,
}

// codeOutcomes classifies the errors that are not etcd's by their gRPC
// code. A code absent here is the request refused on its merits
// (InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
// Unauthenticated, FailedPrecondition, OutOfRange, Aborted, Unimplemented,
// DataLoss…): AppError. ResourceExhausted is among them: what gRPC raises
// with it is nearly always a message over a size limit, the client's
// (MaxCallRecvMsgSize, MaxCallSendMsgSize) or the server's, which every
// member would refuse alike; else an HTTP/2 stream reset for flow control
// or ENHANCE_YOUR_CALM, the latter a server tired of the client's own
// pings, which its keep-alive settings bring on every member alike. etcd's
// own overload ("too many requests") is matched as etcd's error first.
// codes.Canceled never gets here.
var codeOutcomes = map[codes.Code]router.Outcome{
	codes.Unavailable:      router.MemberFault, // the transport failed, the server is going away
	codes.Internal:         router.MemberFault,
	codes.Unknown:          router.MemberFault, // also any plain Go error with no status (io.EOF, a net.Error)
	codes.DeadlineExceeded: router.MemberFault, // the server's own deadline: the caller's is still live
}

// byEtcdError and byStatus index etcdOutcomes for etcdOutcome. rpctypes.Error
// turns a received status error into the rpctypes.EtcdError it stands for,
// matched by its description whatever code it came with (an error etcd's
// server returns as a plain EtcdError, such as "too many requests",
// reaches the client as codes.Unknown). rpctypes.Error does not know every
// error it defines (ErrGRPCTimeoutWaitAppliedIndex, ErrGRPCWatchCanceled,
// ErrGRPCCanceled, ErrGRPCDeadlineExceeded, ErrGRPCInvalidClientAPIVersion
// in v3.7): those are matched with errors.Is, which compares two gRPC
// status errors by value (code and message).
var (
	byEtcdError = map[rpctypes.EtcdError]router.Outcome{}
	byStatus    []error
)

func init() {
	for e, out := range etcdOutcomes {
		if ee, ok := rpctypes.Error(e).(rpctypes.EtcdError); ok {
			byEtcdError[ee] = out
		} else {
			byStatus = append(byStatus, e)
		}
	}
}

// etcdOutcome is the outcome of err if it is one of etcd's server errors,
// wrapped or not, as a gRPC status or as clientv3's rpctypes.EtcdError.
func etcdOutcome(err error) (router.Outcome, bool) {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		out, ok := byEtcdError[ee]
		return out, ok
	}
	st, ok := statusOf(err)
	if !ok {
		return 0, false
	}
	se := st.Err()
	if ee, ok := rpctypes.Error(se).(rpctypes.EtcdError); ok {
		if out, ok := byEtcdError[ee]; ok {
			return out, true
		}
	}
	for _, e := range byStatus {
		if errors.Is(se, e) {
			return etcdOutcomes[e], true
		}
	}
	return 0, false
}

// statusOf is the gRPC status err carries, itself or wrapped, with its own
// message (status.FromError would give a wrapped status the whole chain's
// message, which no longer matches etcd's errors).
func statusOf(err error) (*status.Status, bool) {
	var gs interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &gs) {
		return nil, false
	}
	st := gs.GRPCStatus()
	return st, st != nil
}

// codeOf is the gRPC code of err: that of the status it carries, of the
// rpctypes.EtcdError it wraps, or of the context error it is; Unknown for
// any other error.
func codeOf(err error) codes.Code {
	if st, ok := statusOf(err); ok {
		return st.Code()
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	return status.FromContextError(err).Code()
}
