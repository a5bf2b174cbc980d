package zk

import (
	"fmt"

	"github.com/oproute/oproute/internal/testhooks"
)

func init() {
	testhooks.ZKSessionServers = func(c any) []int {
		conn, ok := c.(*Conn)
		if !ok {
			panic(fmt.Sprintf("testhooks: %T is not a *zk.Conn of the backend", c))
		}
		return conn.sessionServers()
	}
}
