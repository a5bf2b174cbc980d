package zk

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The dial order is a permutation of the active servers, whatever the
// health answers and however they change while it is built: a member in
// neither group made Next index past the end of the order.
func TestDialOrderIsAPermutation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		active := rapid.SliceOfNDistinct(rapid.IntRange(0, 9), 1, 7, rapid.ID[int]).Draw(t, "active")
		start := rapid.IntRange(0, len(active)-1).Draw(t, "start")
		var asked []int
		order := dialOrder(active, start, func(i int) bool {
			asked = append(asked, i)
			return rapid.Bool().Draw(t, "preferred") // a new answer each time asked
		})
		got, want := slices.Sorted(slices.Values(order)), slices.Sorted(slices.Values(active))
		if !slices.Equal(got, want) {
			t.Fatalf("order %v is not a permutation of %v", order, active)
		}
		if len(asked) != len(active) {
			t.Fatalf("asked %d times for %d servers", len(asked), len(active))
		}
	})
}
