package zk_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/internal/testutil"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/tools/testbed"
)

// TestTLS: an ensemble that serves clients only over TLS (secureClientPort,
// client certificates required). The Conn's sessions and probes go over
// TLS; a Conn without it reaches nothing.
func TestTLS(t *testing.T) {
	testutil.MostlyWaits(t)
	c := testbed.StartZKT(t, testbed.ZKOptions{ClientTLS: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eps := c.Endpoints()
	conn, _ := connect(t, c, ozk.WithTLS(c.ClientTLS()))
	if _, err := conn.CreateContext(ctx, "/tls", []byte("1"), 0, acl); err != nil {
		t.Fatal(err)
	}
	// Probes over TLS: every member reachable. A probe's handshake on a
	// starved machine can outlast its timeout, and the member is then
	// unreachable until a later probe answers, so this polls rather than
	// reads Stats once after Connect.
	testutil.PollWhy(t, 30*time.Second, "every member reachable by probes over TLS", func() (bool, string) {
		st := conn.Stats()
		for _, m := range st.Members {
			if !m.Reachable {
				return false, fmt.Sprintf("%s unreachable (%d probes failed)", m.Member.ID, m.ProbeFailures)
			}
		}
		return true, ""
	})
	// A forced read finds no session on its member while that session's
	// TLS handshake, or its move there, is still under way on a starved
	// machine (ErrUnreachable, not sent): only that is tried again.
	for i := range eps {
		var b []byte
		var err error
		tries := 0
		for deadline := time.Now().Add(30 * time.Second); ; {
			tries++
			if b, _, err = conn.GetContext(ozk.WithMember(ctx, eps[i]), "/tls"); !errors.Is(err, ozk.ErrUnreachable) || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond) // paces the retries, not synchronisation
		}
		if err != nil || string(b) != "1" {
			t.Fatalf("read through z%d over TLS (try %d): %q, %v", i, tries, b, err)
		}
		if tries > 1 {
			t.Logf("read through z%d over TLS at try %d", i, tries)
		}
	}
	st := conn.Stats()
	if st.Leader == "" {
		t.Error("no leader known over TLS")
	}

	if plain, _, err := ozk.Connect(eps, sessionTimeout, ozk.WithLogger(quiet{}), ozk.WithConnectTimeout(2*time.Second)); err == nil {
		plain.Close()
		t.Error("a Conn without TLS connected to the TLS port")
	} else if !errors.Is(err, ozk.ErrUnreachable) {
		t.Errorf("plain Connect: %v, want ErrUnreachable", err)
	}
	if _, _, err := ozk.Connect(eps, sessionTimeout, ozk.WithTLS(nil)); !errors.Is(err, router.ErrInvalidConfig) {
		t.Errorf("WithTLS(nil): %v, want ErrInvalidConfig", err)
	}
}
