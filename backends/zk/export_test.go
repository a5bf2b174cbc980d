package zk

// SessionServers returns, per server index, how many of the Conn's
// sessions are connected there: for the external tests (package zk_test).
func (c *Conn) SessionServers() []int { return c.sessionServers() }
