// Package override carries a call's routing override on its context: the
// router sets it (router.WithLeader, WithMember, WithPreferredMember) and
// the backends read it, without it being the router's public API.
package override

import "context"

// Override is a per-call routing override.
type Override struct {
	Leader bool   // to the leader, whatever the class
	Member string // to this member ID
	Prefer bool   // Member is a preference, kept only while it serves reads
}

type key struct{}

// With returns ctx carrying o.
func With(ctx context.Context, o Override) context.Context {
	return context.WithValue(ctx, key{}, o)
}

// From returns the override ctx carries, if any.
func From(ctx context.Context) (Override, bool) {
	if ctx == nil {
		return Override{}, false
	}
	o, ok := ctx.Value(key{}).(Override)
	return o, ok
}

// Any reports whether ctx carries an override.
func Any(ctx context.Context) bool {
	_, ok := From(ctx)
	return ok
}

// Forced returns the member ID a WithMember override forces, if any.
func Forced(ctx context.Context) (string, bool) {
	o, ok := From(ctx)
	return o.Member, ok && o.Member != "" && !o.Prefer
}
