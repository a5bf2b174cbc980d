package zk

import (
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// API is go-zookeeper's *zk.Conn method set, which Conn has too: code
// typed on API takes either, and moves from one to the other with Connect
// alone. The compiler checks both below.
type API interface {
	AddAuth(scheme string, auth []byte) error
	Children(path string) ([]string, *zk.Stat, error)
	ChildrenW(path string) ([]string, *zk.Stat, <-chan zk.Event, error)
	Close()
	Create(path string, data []byte, flags int32, acl []zk.ACL) (string, error)
	CreateContainer(path string, data []byte, flags int32, acl []zk.ACL) (string, error)
	CreateProtectedEphemeralSequential(path string, data []byte, acl []zk.ACL) (string, error)
	CreateTTL(path string, data []byte, flags int32, acl []zk.ACL, ttl time.Duration) (string, error)
	Delete(path string, version int32) error
	Exists(path string) (bool, *zk.Stat, error)
	ExistsW(path string) (bool, *zk.Stat, <-chan zk.Event, error)
	Get(path string) ([]byte, *zk.Stat, error)
	GetACL(path string) ([]zk.ACL, *zk.Stat, error)
	GetW(path string) ([]byte, *zk.Stat, <-chan zk.Event, error)
	IncrementalReconfig(joining, leaving []string, version int64) (*zk.Stat, error)
	Multi(ops ...any) ([]zk.MultiResponse, error)
	Reconfig(members []string, version int64) (*zk.Stat, error)
	Server() string
	SessionID() int64
	Set(path string, data []byte, version int32) (*zk.Stat, error)
	SetACL(path string, acl []zk.ACL, version int32) (*zk.Stat, error)
	SetLogger(l zk.Logger)
	State() zk.State
	Sync(path string) (string, error)
}

var (
	_ API = (*zk.Conn)(nil)
	_ API = (*Conn)(nil)
)

// SetLogger sets go-zookeeper's logger for every session of the Conn, as
// (*zk.Conn).SetLogger does for its one (WithLogger sets it from the
// start).
func (c *Conn) SetLogger(l zk.Logger) { c.log.set(l) }

// swapLogger is a zk.Logger that SetLogger can replace while sessions
// log through it.
type swapLogger struct{ l atomic.Pointer[zk.Logger] }

func (s *swapLogger) set(l zk.Logger) { s.l.Store(&l) }

func (s *swapLogger) Printf(format string, args ...any) {
	if l := s.l.Load(); l != nil && *l != nil {
		(*l).Printf(format, args...)
	}
}
