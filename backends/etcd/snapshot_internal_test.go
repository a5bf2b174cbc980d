package etcd

import "testing"

// TestBenchHold: a bench ends once, whichever of the stream's end, its
// idle limit, its context or a re-pick comes first, and a hold released
// before the pick kept it ends the pick's bench at once.
func TestBenchHold(t *testing.T) {
	ends := 0
	end := func() { ends++ }

	h := &benchHold{}
	h.hold(end)
	h.release()
	h.release()
	if ends != 1 {
		t.Fatalf("held then released twice: %d ends, want 1", ends)
	}

	ends = 0
	h = &benchHold{}
	h.release()
	h.hold(end)
	if ends != 1 {
		t.Fatalf("released before the pick: %d ends, want 1 at once", ends)
	}

	ends = 0
	h = &benchHold{}
	h.hold(end)
	h.hold(end) // gRPC picked again: the first bench ends
	if ends != 1 {
		t.Fatalf("a re-pick: %d ends, want 1 (the first)", ends)
	}
	h.release()
	if ends != 2 {
		t.Fatalf("released after a re-pick: %d ends, want 2", ends)
	}
}
