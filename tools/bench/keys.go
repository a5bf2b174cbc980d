package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/oproute/oproute/tools/backends/zk/zktest"
)

// DefaultKeyPrefix is the workload's keys' prefix on the test bed
// (bench/0000001, …), the one its recorded results were measured with.
const DefaultKeyPrefix = "bench/"

// keySpace is the workload's keys: a prefix and a 7-digit index.
type keySpace string

// key returns the i-th key of the key space.
func (p keySpace) key(i int) string { return fmt.Sprintf("%s%07d", string(p), i) }

// ErrBadKeyPrefix is wrapped by ValidKeyPrefix's errors.
var ErrBadKeyPrefix = errors.New("bench: bad key prefix")

// ErrPrefixInUse: an attached cluster already holds keys under the run's
// prefix, which its cleanup would delete.
var ErrPrefixInUse = errors.New("bench: the key prefix already holds keys")

// ValidKeyPrefix checks a key prefix: path segments ending in "/", as
// routebench/run-1/, so that deleting what is under it never takes a
// sibling's keys (run-1 would take run-10's), and so that ZooKeeper can
// keep the keys as znodes under its path (no empty, "." or ".." segment,
// nothing under /zookeeper, no control characters).
func ValidKeyPrefix(prefix string) error {
	bad := func(why string) error { return fmt.Errorf("%w: %q %s", ErrBadKeyPrefix, prefix, why) }
	switch {
	case prefix == "":
		return bad("is empty")
	case len(prefix) > 200:
		return bad("is longer than 200 bytes")
	case !utf8.ValidString(prefix):
		return bad("is not UTF-8")
	case strings.HasPrefix(prefix, "/"):
		return bad("starts with /")
	case !strings.HasSuffix(prefix, "/"):
		return bad("does not end with /")
	case strings.ContainsFunc(prefix, unicode.IsControl):
		return bad("holds a control character")
	}
	segments := strings.Split(strings.TrimSuffix(prefix, "/"), "/")
	for _, s := range segments {
		if s == "" || s == "." || s == ".." {
			return bad("has an empty, . or .. segment")
		}
	}
	if segments[0] == "zookeeper" {
		return bad("is under ZooKeeper's own /zookeeper")
	}
	return nil
}

// keyStore is an attached cluster's reach over the keys a run writes
// under a prefix: counted before the run, deleted after it.
type keyStore interface {
	// claimKeys makes prefix the run's: it fails with ErrPrefixInUse
	// when keys are under it already, atomically where the store allows,
	// so that two runs given one prefix cannot both start.
	claimKeys(ctx context.Context, prefix string) error
	// deleteKeys deletes every key under prefix, and what holds them
	// where the store has to (ZooKeeper's parent znodes), and returns how
	// many keys it deleted, parents apart.
	deleteKeys(ctx context.Context, prefix string) (int64, error)
}

// znodes maps keys to znodes: the test bed's one level under the root
// (zktest.Znode: bench/0000001 is /bench_0000001, as conformance and every
// zktest user have it) unless the run's keys have a prefix of their own,
// whose keys are paths under it (routebench/x/0000001 is
// /routebench/x/0000001), so that one parent holds them all.
type znodes struct {
	prefix string // "" or DefaultKeyPrefix: the test bed's naming
}

func (z znodes) nested() bool { return z.prefix != "" && z.prefix != DefaultKeyPrefix }

// znode is key's znode.
func (z znodes) znode(key string) string {
	if z.nested() && strings.HasPrefix(key, z.prefix) {
		return "/" + key
	}
	return zktest.Znode(key)
}

// parents are the znodes that hold the keys, outermost first
// (/routebench, /routebench/x); none for the test bed's naming.
func (z znodes) parents() []string {
	if !z.nested() {
		return nil
	}
	var out []string
	path := ""
	for _, s := range strings.Split(strings.TrimSuffix(z.prefix, "/"), "/") {
		path += "/" + s
		out = append(out, path)
	}
	return out
}

// flatPrefix is the name prefix of the keys' znodes under the root with
// the test bed's naming ("bench_").
func (z znodes) flatPrefix() string {
	p := z.prefix
	if p == "" {
		p = DefaultKeyPrefix
	}
	return strings.TrimPrefix(zktest.Znode(p), "/")
}
