package conformance

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// The checker must reject a stale read: a get that starts after a put of
// the same key returned, yet sees the older value.
func TestRegisterModelRejectsStaleRead(t *testing.T) {
	put := func(v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: linInput{put: true, key: "k", value: v}, Call: call, Return: ret}
	}
	get := func(v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 1, Input: linInput{key: "k"}, Output: linOutput{v, true}, Call: call, Return: ret}
	}
	ok := []porcupine.Operation{put("a", 0, 10), put("b", 20, 30), get("b", 40, 50)}
	if !porcupine.CheckOperations(registerModel, ok) {
		t.Fatal("a linearizable history was rejected")
	}
	stale := []porcupine.Operation{put("a", 0, 10), put("b", 20, 30), get("a", 40, 50)}
	if porcupine.CheckOperations(registerModel, stale) {
		t.Fatal("a stale read was accepted")
	}
}
