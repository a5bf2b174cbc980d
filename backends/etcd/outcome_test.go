package etcd

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oproute/oproute/router"

	"github.com/oproute/oproute/internal/testutil"
)

// etcdServerErrors are the server errors rpctypes defines, by name, with
// the outcome each must have when a member returns it to a live caller.
var etcdServerErrors = map[string]struct {
	err  error
	want router.Outcome
}{
	"ErrGRPCEmptyKey":                {rpctypes.ErrGRPCEmptyKey, router.AppError},
	"ErrGRPCKeyNotFound":             {rpctypes.ErrGRPCKeyNotFound, router.AppError},
	"ErrGRPCValueProvided":           {rpctypes.ErrGRPCValueProvided, router.AppError},
	"ErrGRPCLeaseProvided":           {rpctypes.ErrGRPCLeaseProvided, router.AppError},
	"ErrGRPCTooManyOps":              {rpctypes.ErrGRPCTooManyOps, router.AppError},
	"ErrGRPCDuplicateKey":            {rpctypes.ErrGRPCDuplicateKey, router.AppError},
	"ErrGRPCInvalidClientAPIVersion": {rpctypes.ErrGRPCInvalidClientAPIVersion, router.AppError},
	"ErrGRPCInvalidSortOption":       {rpctypes.ErrGRPCInvalidSortOption, router.AppError},
	"ErrGRPCCompacted":               {rpctypes.ErrGRPCCompacted, router.AppError},
	"ErrGRPCFutureRev":               {rpctypes.ErrGRPCFutureRev, router.AppError},
	"ErrGRPCNoSpace":                 {rpctypes.ErrGRPCNoSpace, router.AppError},

	"ErrGRPCLeaseNotFound":    {rpctypes.ErrGRPCLeaseNotFound, router.AppError},
	"ErrGRPCLeaseExist":       {rpctypes.ErrGRPCLeaseExist, router.AppError},
	"ErrGRPCLeaseTTLTooLarge": {rpctypes.ErrGRPCLeaseTTLTooLarge, router.AppError},

	"ErrGRPCWatchCanceled": {rpctypes.ErrGRPCWatchCanceled, router.CallerGaveUp},

	"ErrGRPCMemberExist":            {rpctypes.ErrGRPCMemberExist, router.AppError},
	"ErrGRPCPeerURLExist":           {rpctypes.ErrGRPCPeerURLExist, router.AppError},
	"ErrGRPCMemberNotEnoughStarted": {rpctypes.ErrGRPCMemberNotEnoughStarted, router.AppError},
	"ErrGRPCMemberBadURLs":          {rpctypes.ErrGRPCMemberBadURLs, router.AppError},
	"ErrGRPCMemberNotFound":         {rpctypes.ErrGRPCMemberNotFound, router.AppError},
	"ErrGRPCMemberNotLearner":       {rpctypes.ErrGRPCMemberNotLearner, router.AppError},
	"ErrGRPCLearnerNotReady":        {rpctypes.ErrGRPCLearnerNotReady, router.AppError},
	"ErrGRPCTooManyLearners":        {rpctypes.ErrGRPCTooManyLearners, router.AppError},
	"ErrGRPCClusterIDMismatch":      {rpctypes.ErrGRPCClusterIDMismatch, router.MemberFault},
	//lint:ignore SA1019 a deprecated alias, still defined: the test walks every ErrGRPC* value
	"ErrGRPCClusterIdMismatch": {rpctypes.ErrGRPCClusterIdMismatch, router.MemberFault},

	"ErrGRPCRequestTooLarge":        {rpctypes.ErrGRPCRequestTooLarge, router.AppError},
	"ErrGRPCRequestTooManyRequests": {rpctypes.ErrGRPCRequestTooManyRequests, router.Overloaded},

	"ErrGRPCRootUserNotExist":     {rpctypes.ErrGRPCRootUserNotExist, router.AppError},
	"ErrGRPCRootRoleNotExist":     {rpctypes.ErrGRPCRootRoleNotExist, router.AppError},
	"ErrGRPCUserAlreadyExist":     {rpctypes.ErrGRPCUserAlreadyExist, router.AppError},
	"ErrGRPCUserEmpty":            {rpctypes.ErrGRPCUserEmpty, router.AppError},
	"ErrGRPCUserNotFound":         {rpctypes.ErrGRPCUserNotFound, router.AppError},
	"ErrGRPCRoleAlreadyExist":     {rpctypes.ErrGRPCRoleAlreadyExist, router.AppError},
	"ErrGRPCRoleNotFound":         {rpctypes.ErrGRPCRoleNotFound, router.AppError},
	"ErrGRPCRoleEmpty":            {rpctypes.ErrGRPCRoleEmpty, router.AppError},
	"ErrGRPCAuthFailed":           {rpctypes.ErrGRPCAuthFailed, router.AppError},
	"ErrGRPCPermissionNotGiven":   {rpctypes.ErrGRPCPermissionNotGiven, router.AppError},
	"ErrGRPCPermissionDenied":     {rpctypes.ErrGRPCPermissionDenied, router.AppError},
	"ErrGRPCRoleNotGranted":       {rpctypes.ErrGRPCRoleNotGranted, router.AppError},
	"ErrGRPCPermissionNotGranted": {rpctypes.ErrGRPCPermissionNotGranted, router.AppError},
	"ErrGRPCAuthNotEnabled":       {rpctypes.ErrGRPCAuthNotEnabled, router.AppError},
	"ErrGRPCInvalidAuthToken":     {rpctypes.ErrGRPCInvalidAuthToken, router.AppError},
	"ErrGRPCInvalidAuthMgmt":      {rpctypes.ErrGRPCInvalidAuthMgmt, router.AppError},
	"ErrGRPCAuthOldRevision":      {rpctypes.ErrGRPCAuthOldRevision, router.AppError},

	"ErrGRPCNoLeader":                   {rpctypes.ErrGRPCNoLeader, router.MemberFault},
	"ErrGRPCNotLeader":                  {rpctypes.ErrGRPCNotLeader, router.MemberFault},
	"ErrGRPCLeaderChanged":              {rpctypes.ErrGRPCLeaderChanged, router.MemberFault},
	"ErrGRPCNotCapable":                 {rpctypes.ErrGRPCNotCapable, router.MemberFault},
	"ErrGRPCStopped":                    {rpctypes.ErrGRPCStopped, router.MemberFault},
	"ErrGRPCTimeout":                    {rpctypes.ErrGRPCTimeout, router.MemberFault},
	"ErrGRPCTimeoutDueToLeaderFail":     {rpctypes.ErrGRPCTimeoutDueToLeaderFail, router.MemberFault},
	"ErrGRPCTimeoutDueToConnectionLost": {rpctypes.ErrGRPCTimeoutDueToConnectionLost, router.MemberFault},
	"ErrGRPCTimeoutWaitAppliedIndex":    {rpctypes.ErrGRPCTimeoutWaitAppliedIndex, router.MemberFault},
	"ErrGRPCUnhealthy":                  {rpctypes.ErrGRPCUnhealthy, router.MemberFault},
	"ErrGRPCCorrupt":                    {rpctypes.ErrGRPCCorrupt, router.MemberFault},
	"ErrGRPCNotSupportedForLearner":     {rpctypes.ErrGRPCNotSupportedForLearner, router.MemberFault},
	"ErrGRPCBadLeaderTransferee":        {rpctypes.ErrGRPCBadLeaderTransferee, router.AppError},

	"ErrGRPCWrongDowngradeVersionFormat":   {rpctypes.ErrGRPCWrongDowngradeVersionFormat, router.AppError},
	"ErrGRPCInvalidDowngradeTargetVersion": {rpctypes.ErrGRPCInvalidDowngradeTargetVersion, router.AppError},
	"ErrGRPCClusterVersionUnavailable":     {rpctypes.ErrGRPCClusterVersionUnavailable, router.AppError},
	"ErrGRPCDowngradeInProcess":            {rpctypes.ErrGRPCDowngradeInProcess, router.AppError},
	"ErrGRPCNoInflightDowngrade":           {rpctypes.ErrGRPCNoInflightDowngrade, router.AppError},

	"ErrGRPCCanceled":         {rpctypes.ErrGRPCCanceled, router.CallerGaveUp},
	"ErrGRPCDeadlineExceeded": {rpctypes.ErrGRPCDeadlineExceeded, router.MemberFault},
}

// served is how a call the member answered ends.
func served(err error) balancer.DoneInfo {
	return balancer.DoneInfo{Err: err, BytesSent: true, BytesReceived: true}
}

// onTheWire is err as a client receives it: a new status error with the
// same code and message, not the rpctypes value itself.
func onTheWire(err error) error {
	return status.ErrorProto(status.Convert(err).Proto())
}

// rpctypesServerErrorNames parses rpctypes/error.go of the etcd in go.mod
// for the names of the server errors it defines (ErrGRPC*).
func rpctypesServerErrorNames(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "go.etcd.io/etcd/api/v3").Output()
	if err != nil {
		testutil.Skip(t, fmt.Sprintf("cannot locate go.etcd.io/etcd/api/v3 (go list: %v): not checking that every rpctypes error is classified", err))
	}
	file := filepath.Join(strings.TrimSpace(string(out)), "v3rpc", "rpctypes", "error.go")
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, spec := range gd.Specs {
			for _, n := range spec.(*ast.ValueSpec).Names {
				if strings.HasPrefix(n.Name, "ErrGRPC") {
					names = append(names, n.Name)
				}
			}
		}
	}
	if len(names) == 0 {
		t.Fatalf("no ErrGRPC* var in %s", file)
	}
	return names
}

func TestOutcomeClassifiesEveryEtcdServerError(t *testing.T) {
	defined := map[string]bool{}
	for _, n := range rpctypesServerErrorNames(t) {
		defined[n] = true
		if _, ok := etcdServerErrors[n]; !ok {
			t.Errorf("rpctypes.%s is not classified: add it to etcdOutcomes and to this test", n)
		}
	}
	for n, e := range etcdServerErrors {
		if !defined[n] {
			t.Errorf("this test names rpctypes.%s, which rpctypes/error.go no longer defines", n)
		}
		if got, ok := etcdOutcomes[e.err]; !ok {
			t.Errorf("rpctypes.%s is not in etcdOutcomes", n)
		} else if got != e.want {
			t.Errorf("etcdOutcomes[rpctypes.%s] = %v, want %v", n, got, e.want)
		}
	}
	if len(etcdOutcomes) != len(etcdServerErrors)-1 { // less the deprecated alias
		t.Errorf("etcdOutcomes has %d errors, this test %d (less one alias)", len(etcdOutcomes), len(etcdServerErrors)-1)
	}
}

func TestOutcomeEtcdServerErrors(t *testing.T) {
	live := context.Background()
	for name, e := range etcdServerErrors {
		t.Run(name+" is "+e.want.String(), func(t *testing.T) {
			forms := map[string]error{
				"as defined":             e.err,
				"as received":            onTheWire(e.err),
				"wrapped":                fmt.Errorf("etcdclient: %w", onTheWire(e.err)),
				"wrapped twice":          fmt.Errorf("a: %w", fmt.Errorf("b: %w", onTheWire(e.err))),
				"as clientv3 sees it":    rpctypes.Error(onTheWire(e.err)),
				"joined with another":    errors.Join(errors.New("context"), onTheWire(e.err)),
				"clientv3 form, wrapped": fmt.Errorf("x: %w", rpctypes.Error(onTheWire(e.err))),
			}
			for form, err := range forms {
				if got := outcomeOf(live, served(err)); got != e.want {
					t.Errorf("%s (%v): outcome %v, want %v", form, err, got, e.want)
				}
			}
			// The caller's end comes first, whatever the member said.
			done, cancel := context.WithCancel(live)
			cancel()
			if got := outcomeOf(done, served(onTheWire(e.err))); got != router.CallerGaveUp {
				t.Errorf("with the caller's ctx cancelled: outcome %v, want caller_gave_up", got)
			}
		})
	}
}

func TestOutcomeEtcdErrorsAsEtcdSendsThem(t *testing.T) {
	// etcd's server returns a few errors as plain rpctypes.EtcdError
	// values, not gRPC statuses (v3rpc/util.go: ErrTooManyRequests,
	// ErrMemberNotEnoughStarted). gRPC sends those as codes.Unknown with
	// the error's text; they still get their etcd outcome.
	live := context.Background()
	for _, tc := range []struct {
		name string
		err  error
		want router.Outcome
	}{
		{"too many requests sent as Unknown is overloaded", status.Error(codes.Unknown, rpctypes.ErrTooManyRequests.Error()), router.Overloaded},
		{"not enough started members sent as Unknown is app_error", status.Error(codes.Unknown, rpctypes.ErrMemberNotEnoughStarted.Error()), router.AppError},
		{"not leader is member_fault though FailedPrecondition is app_error", onTheWire(rpctypes.ErrGRPCNotLeader), router.MemberFault},
		{"learner is member_fault though FailedPrecondition is app_error", onTheWire(rpctypes.ErrGRPCNotSupportedForLearner), router.MemberFault},
		{"corrupt is member_fault though DataLoss is app_error", onTheWire(rpctypes.ErrGRPCCorrupt), router.MemberFault},
		{"too many requests is overloaded though ResourceExhausted is app_error", onTheWire(rpctypes.ErrGRPCRequestTooManyRequests), router.Overloaded},
		{"no space is app_error", onTheWire(rpctypes.ErrGRPCNoSpace), router.AppError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := outcomeOf(live, served(tc.err)); got != tc.want {
				t.Errorf("outcome of %v = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestOutcomeByGRPCCode(t *testing.T) {
	want := map[codes.Code]router.Outcome{
		codes.Canceled:           router.CallerGaveUp,
		codes.Unknown:            router.MemberFault,
		codes.InvalidArgument:    router.AppError,
		codes.DeadlineExceeded:   router.MemberFault,
		codes.NotFound:           router.AppError,
		codes.AlreadyExists:      router.AppError,
		codes.PermissionDenied:   router.AppError,
		codes.ResourceExhausted:  router.AppError, // a message over a size limit, every member's alike
		codes.FailedPrecondition: router.AppError,
		codes.Aborted:            router.AppError,
		codes.OutOfRange:         router.AppError,
		codes.Unimplemented:      router.AppError,
		codes.Internal:           router.MemberFault,
		codes.Unavailable:        router.MemberFault,
		codes.DataLoss:           router.AppError,
		codes.Unauthenticated:    router.AppError,
		codes.Code(99):           router.AppError, // a code from a later gRPC
	}
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		if _, ok := want[c]; !ok {
			t.Errorf("code %v: no expected outcome in this test", c)
		}
	}
	live := context.Background()
	for c, out := range want {
		t.Run(c.String()+" from a live call is "+out.String(), func(t *testing.T) {
			err := status.Error(c, "some failure")
			if got := outcomeOf(live, served(err)); got != out {
				t.Errorf("outcome %v, want %v", got, out)
			}
			if got := outcomeOf(live, served(fmt.Errorf("wrapped: %w", err))); got != out {
				t.Errorf("wrapped: outcome %v, want %v", got, out)
			}
		})
	}
}

func TestOutcomeRules(t *testing.T) {
	live := context.Background()
	cancelled, cancel := context.WithCancel(live)
	cancel()
	expired, cancel2 := context.WithDeadline(live, time.Now().Add(-time.Second))
	defer cancel2()
	sentOnly := func(err error) balancer.DoneInfo { return balancer.DoneInfo{Err: err, BytesSent: true} }
	receivedOnly := func(err error) balancer.DoneInfo { return balancer.DoneInfo{Err: err, BytesReceived: true} }
	notSent := func(err error) balancer.DoneInfo { return balancer.DoneInfo{Err: err} }
	unavailable := status.Error(codes.Unavailable, "transport is closing")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		di   balancer.DoneInfo
		want router.Outcome
	}{
		// No error.
		{"a served call without error is ok", live, served(nil), router.OK},
		{"a sent call without error is ok", live, sentOnly(nil), router.OK},
		{"a call without error whose ctx then ended is ok", cancelled, served(nil), router.OK},
		{"no error and nothing sent is not_sent (picked transport not ready, gRPC picks again)", live, balancer.DoneInfo{}, router.NotSent},

		// The caller gave up.
		{"an expired caller deadline is caller_gave_up", expired, served(status.Error(codes.DeadlineExceeded, "context deadline exceeded")), router.CallerGaveUp},
		{"a cancelled caller is caller_gave_up", cancelled, served(status.Error(codes.Canceled, "context canceled")), router.CallerGaveUp},
		{"an expired caller deadline is caller_gave_up even for a member fault", expired, served(onTheWire(rpctypes.ErrGRPCNoLeader)), router.CallerGaveUp},
		{"an expired caller deadline is caller_gave_up even for an app error", expired, served(onTheWire(rpctypes.ErrGRPCCompacted)), router.CallerGaveUp},
		{"an expired caller deadline is caller_gave_up even before sending", expired, notSent(status.Error(codes.DeadlineExceeded, "context deadline exceeded")), router.CallerGaveUp},
		{"a cancelled caller is caller_gave_up even for unavailable before sending", cancelled, notSent(unavailable), router.CallerGaveUp},
		{"Canceled with a live ctx is caller_gave_up", live, served(status.Error(codes.Canceled, "grpc: the client connection is closing")), router.CallerGaveUp},
		{"a plain context.Canceled is caller_gave_up", live, served(context.Canceled), router.CallerGaveUp},
		{"a wrapped context.Canceled is caller_gave_up", live, served(fmt.Errorf("rpc: %w", context.Canceled)), router.CallerGaveUp},

		// Never sent.
		{"unavailable before sending is not_sent", live, notSent(unavailable), router.NotSent},
		{"draining connection before sending is not_sent", live, notSent(status.Error(codes.Unavailable, "the connection is draining")), router.NotSent},
		{"wrapped unavailable before sending is not_sent", live, notSent(fmt.Errorf("x: %w", unavailable)), router.NotSent},
		{"unavailable after sending is member_fault", live, sentOnly(unavailable), router.MemberFault},
		{"unavailable after receiving is member_fault", live, receivedOnly(unavailable), router.MemberFault},
		{"internal error before sending is member_fault (only unavailable is not_sent)", live, notSent(status.Error(codes.Internal, "header list size to send violates the maximum size")), router.MemberFault},
		{"app error before sending is app_error", live, notSent(status.Error(codes.InvalidArgument, "bad")), router.AppError},

		// The server's own deadline.
		{"DeadlineExceeded from the server with a live ctx is member_fault", live, served(status.Error(codes.DeadlineExceeded, "deadline exceeded")), router.MemberFault},
		{"etcd's context deadline exceeded with a live ctx is member_fault", live, served(onTheWire(rpctypes.ErrGRPCDeadlineExceeded)), router.MemberFault},
		{"a plain context.DeadlineExceeded with a live ctx is member_fault", live, served(context.DeadlineExceeded), router.MemberFault},

		// Plain Go errors: the transport failed.
		{"io.EOF is member_fault", live, served(io.EOF), router.MemberFault},
		{"io.ErrUnexpectedEOF is member_fault", live, sentOnly(io.ErrUnexpectedEOF), router.MemberFault},
		{"a net error is member_fault", live, sentOnly(&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}), router.MemberFault},
		{"a wrapped net error is member_fault", live, sentOnly(fmt.Errorf("conn: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})), router.MemberFault},
		{"an error with a nil status is member_fault", live, served(nilStatusError{}), router.MemberFault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := outcomeOf(tc.ctx, tc.di); got != tc.want {
				t.Errorf("outcomeOf(%+v) = %v, want %v", tc.di, got, tc.want)
			}
		})
	}
}

// nilStatusError claims a gRPC status but has none.
type nilStatusError struct{}

func (nilStatusError) Error() string              { return "no status" }
func (nilStatusError) GRPCStatus() *status.Status { return nil }
