package pool_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/oproute/oproute/internal/pool"
)

func TestRoundRobinPerMember(t *testing.T) {
	p := pool.New([][]string{{"a0", "a1", "a2"}, {}, {"c0"}})
	var got []string
	for range 6 {
		c, ok := p.Get(0)
		if !ok {
			t.Fatal("member 0 has connections")
		}
		got = append(got, c)
	}
	if fmt.Sprint(got) != "[a0 a1 a2 a0 a1 a2]" {
		t.Fatalf("order %v", got)
	}
	if _, ok := p.Get(1); ok {
		t.Fatal("member 1 has no ready connection")
	}
	for _, i := range []int{-1, 3} {
		if _, ok := p.Get(i); ok {
			t.Fatalf("Get(%d) out of range succeeded", i)
		}
	}
	var nilPool *pool.Pool[string]
	if _, ok := nilPool.Get(0); ok {
		t.Fatal("nil pool should be empty")
	}
}

func TestEvenUnderConcurrency(t *testing.T) {
	p := pool.New([][]int{{0, 1, 2}})
	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			local := map[int]int{}
			for range 3000 {
				c, _ := p.Get(0)
				local[c]++
			}
			mu.Lock()
			for k, v := range local {
				counts[k] += v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	for c := range 3 {
		if counts[c] != 4000 {
			t.Fatalf("counts %v, want 4000 each", counts)
		}
	}
}

func BenchmarkGet(b *testing.B) {
	p := pool.New([][]int{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			p.Get(i % 3)
			i++
		}
	})
}
