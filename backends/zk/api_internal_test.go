package zk

import (
	"fmt"
	"strings"
	"testing"
	"time"
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

// TestJitterSpreadsWaits: jittered waits stay within ±20 % of the wait
// and cover that range, so a fleet's retries spread out.
func TestJitterSpreadsWaits(t *testing.T) {
	const d = 100 * time.Millisecond
	lo, hi := d, d
	for range 2000 {
		j := jitter(d)
		if j < 80*time.Millisecond || j > 120*time.Millisecond {
			t.Fatalf("jitter(%v) = %v, outside ±20 %%", d, j)
		}
		lo, hi = min(lo, j), max(hi, j)
	}
	if lo > 82*time.Millisecond || hi < 118*time.Millisecond {
		t.Errorf("2,000 jittered waits span %v–%v, want about 80–120 ms", lo, hi)
	}
}
