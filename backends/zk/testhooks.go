package zk

import "github.com/oproute/oproute/internal/testhooks"

func init() {
	testhooks.ZKSessionServers = func(c any) []int { return c.(*Conn).sessionServers() }
}
