// Package zk4lw speaks ZooKeeper's four-letter-word admin commands (srvr,
// mntr, cons): one command per TCP connection, the server answers in text
// and closes. The backend's leader probe and the test bed both use it.
package zk4lw

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
)

// ErrNotServing: the server answered but has no quorum ("This ZooKeeper
// instance is not currently serving requests").
var ErrNotServing = errors.New("zk4lw: server not serving requests")

// ErrNotAllowed: the server refused the command, which is not in its
// 4lw.commands.whitelist ("mntr is not executed because it is not in the
// whitelist."). ZooKeeper never refuses srvr.
var ErrNotAllowed = errors.New("zk4lw: command not in the server's 4lw.commands.whitelist")

// Dialer opens the connection a command goes over.
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// Send sends cmd to addr and returns the whole answer. ctx bounds the
// dial, the write and the read: a frozen server (its kernel accepts, the
// process never answers) costs at most ctx's deadline.
func Send(ctx context.Context, dial Dialer, addr, cmd string) ([]byte, error) {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("zk4lw %s %s: %w", cmd, addr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := io.WriteString(c, cmd); err != nil {
		return nil, fmt.Errorf("zk4lw %s %s: %w", cmd, addr, ctxErr(ctx, err))
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return nil, fmt.Errorf("zk4lw %s %s: %w", cmd, addr, ctxErr(ctx, err))
	}
	if bytes.Contains(b, []byte("not currently serving requests")) {
		return b, fmt.Errorf("zk4lw %s %s: %w", cmd, addr, ErrNotServing)
	}
	if bytes.Contains(b, []byte("is not executed because it is not in the whitelist")) {
		return b, fmt.Errorf("zk4lw %s %s: %w", cmd, addr, ErrNotAllowed)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("zk4lw %s %s: empty answer: the connection closed", cmd, addr)
	}
	return b, nil
}

// ctxErr reports a failure caused by ctx as ctx's error. The connection's
// deadline is ctx's, and may fire a moment before ctx itself says so.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
	}
	return err
}

// Srvr is the part of a srvr answer the router needs.
type Srvr struct {
	// Mode is "leader", "follower", "observer" or "standalone".
	Mode string
	// Zxid is the last transaction id the server has seen; its high 32
	// bits are the ZAB epoch.
	Zxid int64
	// Connections is the number of client connections.
	Connections int
	// Version is the "Zookeeper version:" line's value: the version and
	// its build ("3.8.0-…, built on 2024-12-29 17:54 UTC").
	Version string
}

// Epoch returns the ZAB epoch of Zxid.
func (s Srvr) Epoch() uint64 { return uint64(s.Zxid) >> 32 }

// ParseSrvr reads srvr's "Key: value" lines. go-zookeeper's FLWSrvr cannot
// be used: its version-line pattern fails on ZooKeeper 3.8.
func ParseSrvr(b []byte) (Srvr, error) {
	var s Srvr
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Mode":
			s.Mode = v
		case "Zxid":
			z, err := strconv.ParseInt(strings.TrimPrefix(v, "0x"), 16, 64)
			if err != nil {
				return s, fmt.Errorf("zk4lw: srvr Zxid %q: %w", v, err)
			}
			s.Zxid = z
		case "Connections":
			s.Connections, _ = strconv.Atoi(v)
		case "Zookeeper version":
			s.Version = v
		}
	}
	if s.Mode == "" {
		return s, fmt.Errorf("zk4lw: srvr answer without Mode: %.200q", b)
	}
	return s, nil
}

// ParseMntr reads mntr's tab-separated "key value" lines.
func ParseMntr(b []byte) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "\t"); ok {
			m[k] = v
		}
	}
	return m
}

// Requests is what a server's own sessions asked of it, from mntr's request
// latency summaries, which count a request at the server its session is on
// (a write through a follower counts there, not at the leader).
type Requests struct {
	// Updates are writes, session creation and closing included.
	Updates uint64
	// Reads include syncs.
	Reads uint64
}

// ParseRequests reads Requests from a parsed mntr answer.
func ParseRequests(mntr map[string]string) Requests {
	u, _ := strconv.ParseUint(mntr["zk_cnt_updatelatency"], 10, 64)
	r, _ := strconv.ParseUint(mntr["zk_cnt_readlatency"], 10, 64)
	return Requests{Updates: u, Reads: r}
}
