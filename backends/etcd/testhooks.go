package etcd

import (
	"fmt"

	"github.com/oproute/oproute/internal/testhooks"
)

func init() {
	testhooks.EtcdWaitingWrites = func(c any) int { return int(hooked(c).entry.Load().leader.waiters.Load()) }
	testhooks.EtcdLeaderReachable = func(c any) bool { return hooked(c).entry.Load().leaderReachable() }
	testhooks.EtcdEnded = func(c any) bool {
		select {
		case <-hooked(c).ended:
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

// hooked is a hook's client, which must be this package's.
func hooked(c any) *Client {
	cli, ok := c.(*Client)
	if !ok {
		panic(fmt.Sprintf("testhooks: %T is not an *etcd.Client", c))
	}
	return cli
}
