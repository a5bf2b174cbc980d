package members

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/oproute/oproute/router"
)

func TestBuild(t *testing.T) {
	addrOf := func(ep string) (string, error) {
		if ep == "" {
			return "", errors.New("empty")
		}
		return strings.TrimPrefix(ep, "http://"), nil
	}
	ms, byAddr, err := Build([]string{"http://a:1", "b:2"}, addrOf, map[string]string{"b:2": "z"})
	if err != nil {
		t.Fatal(err)
	}
	want := []router.Member{{ID: "http://a:1", Addr: "a:1"}, {ID: "b:2", Addr: "b:2", Zone: "z"}}
	if d := cmp.Diff(want, ms); d != "" {
		t.Errorf("members (-want +got):\n%s", d)
	}
	if byAddr["a:1"] != 0 || byAddr["b:2"] != 1 {
		t.Errorf("byAddr = %v", byAddr)
	}
	if _, _, err := Build([]string{"a:1", "http://a:1"}, addrOf, nil); !errors.Is(err, router.ErrDuplicateMember) {
		t.Errorf("same address twice: %v, want ErrDuplicateMember", err)
	}
	if _, _, err := Build([]string{""}, addrOf, nil); err == nil {
		t.Error("a bad endpoint was accepted")
	}
}

func TestConfig(t *testing.T) {
	base := router.Config{Policy: router.Hybrid, MinEjectGap: 7}
	cfg := Options{Policy: router.Sticky, ClientZone: "a", Tune: func(c *router.Config) { c.MaxLag = 5 }}.Config(base)
	if cfg.Policy != router.Sticky || cfg.ClientZone != "a" || cfg.MaxLag != 5 || cfg.MinEjectGap != 7 {
		t.Errorf("Config = %+v", cfg)
	}
	if cfg := (Options{}).Config(base); cfg.Policy != router.Hybrid {
		t.Errorf("no policy asked: %q, want the backend's default", cfg.Policy)
	}
}
