package etcd

import "github.com/oproute/oproute/internal/testhooks"

func init() {
	testhooks.EtcdWaitingWrites = func(c any) int { return int(c.(*Client).entry.Load().leader.waiters.Load()) }
	testhooks.EtcdLeaderReachable = func(c any) bool { return c.(*Client).entry.Load().leaderReachable() }
	testhooks.EtcdEnded = func(c any) bool {
		select {
		case <-c.(*Client).ended:
			return true
		default:
			return false
		}
	}
	testhooks.EtcdWatchQuietAfter = watchQuietAfter
	testhooks.EtcdClassifiedRPCs = func() []string {
		out := make([]string, 0, len(rpcClasses))
		for m := range rpcClasses {
			out = append(out, m)
		}
		return out
	}
}
