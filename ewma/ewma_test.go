package ewma_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oproute/oproute/ewma"
)

func TestNewRejectsNonsense(t *testing.T) {
	for _, alpha := range []float64{0, -0.1, 1.5} {
		if _, err := ewma.New(alpha, 0); err == nil {
			t.Errorf("New(%v) accepted an alpha outside (0,1]", alpha)
		}
	}
	if _, err := ewma.New(0.3, -time.Second); err == nil {
		t.Error("New accepted a negative initial value")
	}
}

func TestFormula(t *testing.T) {
	e, err := ewma.New(0.5, 7*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Value(); got != 7*time.Millisecond {
		t.Fatalf("initial value = %v, want 7ms", got)
	}
	e.Add(10 * time.Millisecond) // first sample replaces the initial value
	e.Add(20 * time.Millisecond) // 0.5*20 + 0.5*10
	e.Add(40 * time.Millisecond) // 0.5*40 + 0.5*15
	if got, want := e.Value(), 27500*time.Microsecond; got != want {
		t.Fatalf("value = %v, want %v", got, want)
	}
	if e.Count() != 3 {
		t.Fatalf("count = %d, want 3", e.Count())
	}
	e.Reset(time.Millisecond)
	if e.Count() != 0 || e.Value() != time.Millisecond {
		t.Fatalf("after Reset: count %d value %v", e.Count(), e.Value())
	}
}

func TestConcurrentAddsConverge(t *testing.T) {
	e, _ := ewma.New(0.3, 0)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				e.Add(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if e.Count() != 8000 {
		t.Fatalf("count = %d, want 8000 (a sample was lost)", e.Count())
	}
	if got := e.Value(); got != 5*time.Millisecond {
		t.Fatalf("value = %v, want 5ms", got)
	}
}

func BenchmarkAdd(b *testing.B) {
	e, _ := ewma.New(ewma.DefaultAlpha, time.Millisecond)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			e.Add(time.Millisecond)
		}
	})
}

func ExampleEWMA() {
	e, _ := ewma.New(ewma.DefaultAlpha, time.Millisecond)
	for _, ms := range []int{10, 10, 20} {
		e.Add(time.Duration(ms) * time.Millisecond)
	}
	fmt.Println(e.Value())
	// Output: 13ms
}
