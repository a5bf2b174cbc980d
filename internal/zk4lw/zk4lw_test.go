package zk4lw

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// ZooKeeper 3.8's srvr answer, whose version line go-zookeeper's FLWSrvr
// cannot parse.
const srvr38 = `Zookeeper version: 3.8.0-${mvngit.commit.id}, built on 2024-12-29 17:54 UTC
Latency min/avg/max: 0/0.0/0
Received: 4
Sent: 3
Connections: 2
Outstanding: 0
Zxid: 0x300000007
Mode: leader
Node count: 5
Proposal sizes last/min/max: -1/-1/-1
`

func TestParseSrvr(t *testing.T) {
	s, err := ParseSrvr([]byte(srvr38))
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != "leader" || s.Epoch() != 3 || s.Zxid != 0x300000007 || s.Connections != 2 || s.Version != "3.8.0-${mvngit.commit.id}, built on 2024-12-29 17:54 UTC" {
		t.Fatalf("%+v (epoch %d)", s, s.Epoch())
	}
	if _, err := ParseSrvr([]byte("Zxid: 0x1\n")); err == nil {
		t.Fatal("an answer without Mode parsed")
	}
	if _, err := ParseSrvr([]byte("Zxid: zz\nMode: follower\n")); err == nil {
		t.Fatal("a bad Zxid parsed")
	}
}

// serve answers one connection with answer, or never when answer is "".
func serve(t *testing.T, answer string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4)
		c.Read(buf)
		if answer == "" {
			time.Sleep(time.Second) // a frozen server: hold the connection, say nothing
			return
		}
		c.Write([]byte(answer))
	}()
	return ln.Addr().String()
}

func TestSend(t *testing.T) {
	ctx := context.Background()
	b, err := Send(ctx, nil, serve(t, srvr38), "srvr")
	if err != nil || string(b) != srvr38 {
		t.Fatalf("%q %v", b, err)
	}
	_, err = Send(ctx, nil, serve(t, "This ZooKeeper instance is not currently serving requests\n"), "srvr")
	if !errors.Is(err, ErrNotServing) {
		t.Fatalf("no quorum: %v, want ErrNotServing", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Send(tctx, nil, serve(t, ""), "srvr")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("frozen server: %v after %v, want a deadline error at 100 ms", err, time.Since(start))
	}
}
