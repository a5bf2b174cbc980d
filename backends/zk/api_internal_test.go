package zk

import (
	"fmt"
	"strings"
	"testing"
)

// TestSetLoggerSwapsTheSessionsLogger: sessions log through the Conn's
// swapLogger, so what SetLogger sets is what every session logs to from
// then on.
func TestSetLoggerSwapsTheSessionsLogger(t *testing.T) {
	var a, b lines
	c := &Conn{}
	c.log.set(&a)
	c.log.Printf("one")
	c.SetLogger(&b)
	c.log.Printf("two")
	c.SetLogger(nil)
	c.log.Printf("three") // dropped, not a panic
	if strings.Join(a, ",") != "one" || strings.Join(b, ",") != "two" {
		t.Errorf("first logger got %q, second %q; want one line each", a, b)
	}
}

type lines []string

func (l *lines) Printf(format string, args ...any) { *l = append(*l, fmt.Sprintf(format, args...)) }
