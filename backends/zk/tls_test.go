package zk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	ozk "github.com/oproute/oproute/backends/zk"
	"github.com/oproute/oproute/router"
	"github.com/oproute/oproute/testbed"
)

// TestTLS: an ensemble that serves clients only over TLS (secureClientPort,
// client certificates required). The Conn's sessions and probes go over
// TLS; a Conn without it reaches nothing.
func TestTLS(t *testing.T) {
	c := testbed.StartZKT(t, testbed.ZKOptions{ClientTLS: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eps := c.Endpoints()
	conn, _ := connect(t, c, ozk.WithTLS(c.ClientTLS()))
	if _, err := conn.CreateContext(ctx, "/tls", []byte("1"), 0, acl); err != nil {
		t.Fatal(err)
	}
	for i := range eps {
		b, _, err := conn.GetContext(ozk.WithMember(ctx, eps[i]), "/tls")
		if err != nil || string(b) != "1" {
			t.Fatalf("read through z%d over TLS: %q, %v", i, b, err)
		}
	}
	st := conn.Stats()
	for _, m := range st.Members {
		if !m.Reachable {
			t.Errorf("%s unreachable: probes over TLS failed", m.Member.ID)
		}
	}
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
