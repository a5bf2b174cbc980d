// Package testhooks hands the backends' tests against real servers what
// the backends keep unexported. Those tests live in the tools module
// (tools/backends/...), beside the test bed, to keep the test bed's
// dependencies out of the SDK's module; a package's own _test.go files
// cannot reach them there. Each backend sets its hooks when it loads;
// nothing but those tests reads them.
package testhooks

import "time"

// The etcd backend's: each client argument is an *etcd.Client.
var (
	// EtcdWaitingWrites is how many writes wait for a reachable leader.
	EtcdWaitingWrites func(client any) int
	// EtcdLeaderReachable reports whether a write would find a reachable
	// leader now.
	EtcdLeaderReachable func(client any) bool
	// EtcdEnded reports whether the client's router has stopped.
	EtcdEnded func(client any) bool
	// EtcdWatchQuietAfter is how long a watch stream stays silent before
	// it is asked for its progress.
	EtcdWatchQuietAfter time.Duration
	// EtcdClassifiedRPCs are the full method names the backend classifies.
	EtcdClassifiedRPCs func() []string
)

// The ZooKeeper backend's: each conn argument is an *zk.Conn of the
// backend's package.
var (
	// ZKSessionServers returns, per server index, how many of the Conn's
	// sessions are connected there.
	ZKSessionServers func(conn any) []int
)
