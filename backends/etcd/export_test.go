package etcd

// What the external tests (package etcd_test) need of the unexported.
var TxnIsReadOnly = txnIsReadOnly

// WaitingWrites is how many writes wait for a reachable leader.
func WaitingWrites(c *Client) int { return int(c.entry.Load().leader.waiters.Load()) }

// LeaderReachable reports whether a write would find a reachable leader now.
func LeaderReachable(c *Client) bool { return c.entry.Load().leaderReachable() }

// Ended reports whether the client's router has stopped.
func Ended(c *Client) bool {
	select {
	case <-c.ended:
		return true
	default:
		return false
	}
}

// WatchQuietAfter is how long a watch stream stays silent before it is
// asked for its progress.
const WatchQuietAfter = watchQuietAfter
