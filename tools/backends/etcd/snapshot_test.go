package etcd_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/oproute/oproute/backends/etcd"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/tools/testbed"
)

// TestAbandonedSnapshotEndsItsBench: a Snapshot benches the member it
// streams from; a caller that reads a little and closes the reader
// (clientv3 then stops reading without cancelling the stream, which stays
// open while its context lives) has the member back in the read pool
// within the bench's idle limit (2 s) and a probe round, not when the
// context ends a minute later.
func TestAbandonedSnapshotEndsItsBench(t *testing.T) {
	c := testbed.StartEtcdT(t, testbed.EtcdOptions{Topology: testbed.DefaultTopology(3)})
	cli := newClient(t, c)
	ctx := context.Background()
	// 8 MB: more than the stream's flow-control windows hold unread.
	big := strings.Repeat("x", 256<<10)
	for i := range 32 {
		if _, err := cli.Put(ctx, fmt.Sprint("snap/", i), big); err != nil {
			t.Fatal(err)
		}
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	target := (leader + 1) % 3
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rc, err := cli.Snapshot(etcd.WithMember(sctx, c.Endpoints()[target]))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rc, make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if m := cli.Stats().Members[target]; !m.Ejected || m.OutReason != "maintenance" {
		t.Fatalf("the member streaming a snapshot is not benched: %+v", m)
	}
	rc.Close()
	back := testutil.PollWhy(t, 5*time.Second, "the member back in the pool after its snapshot's reader closed", func() (bool, string) {
		m := cli.Stats().Members[target]
		return !m.Ejected, m.OutReason
	})
	t.Logf("back in the pool %v after the reader closed", back.Round(time.Millisecond))
}
