//go:build race

package testbed

import "errors"

// startMemberServer refuses: a race-instrumented binary links no etcd
// server (its race build cost a cold run minutes), and memberBinary builds
// a plain one to run members.
func startMemberServer(memberSpec) (memberServer, error) {
	return memberServer{}, errors.New("a race-instrumented binary hosts no etcd member")
}
