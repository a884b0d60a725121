// Package relayctx carries, in a request's context, the intern whose jail
// relay the request came through. The gateway's relay (internal/egress)
// serves the gateway's API in process on a jail's relay connection and
// sets it; code that keys anything per client (a rate limiter) reads it,
// since every relayed request otherwise looks like 127.0.0.1.
package relayctx

import "context"

type key struct{}

// WithIntern returns ctx marked as a request relayed for intern id.
func WithIntern(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, key{}, id)
}

// Intern is the intern whose relay carried ctx's request; ok is false for
// a request that did not come through a jail's relay.
func Intern(ctx context.Context) (id string, ok bool) {
	id, ok = ctx.Value(key{}).(string)
	return id, ok && id != ""
}
