package zk

import (
	"context"
	"testing"

	"github.com/go-zookeeper/zk"
)

// BenchmarkDo measures what the Conn adds around a go-zookeeper call: the
// move gate, and for a context that can be cancelled, the goroutine that
// lets the call be abandoned (go-zookeeper's calls take no context).
func BenchmarkDo(b *testing.B) {
	s := &session{c: &Conn{}, authSem: make(chan struct{}, 1)}
	call := func(*zk.Conn) (int, error) { return 1, nil }
	b.Run("background", func(b *testing.B) {
		ctx := context.Background()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				do(ctx, s, -1, call)
			}
		})
	})
	b.Run("cancellable", func(b *testing.B) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				do(ctx, s, -1, call)
			}
		})
	})
}
