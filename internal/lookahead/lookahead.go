// Package lookahead shows a relay what of a streamed response body has
// already arrived and not been read, so that it can send everything that
// is waiting in one write without ever holding back what is not.
//
// Its figures (docs/benchmarks.md as of 233a0f0, "Chat, round 4", binaries before and
// after alternated, two runs each): the gateway alone relayed a chunk for
// 6.8 and 9.5 µs of CPU, against 9.3 and 10.2 µs before, and would carry
// 235,000 and 211,000 chunks per second per core, against 138,000 and
// 122,000; a turn whose daemon events arrived in one 236-byte read went
// from five writes to the caller to one (TestBurstLeavesInOneWrite in
// internal/chat).
//
// The Body reaches the transport through the request's context (With)
// because the Connect client that reads the daemon's stream exposes
// neither the HTTP response nor its body to the caller: the context is the
// one thing a call hands to its transport. Requests whose context carries
// no Body pass through untouched.
package lookahead

import (
	"context"
	"io"
	"net/http"
	"sync"
)

// Body shows the reader of one streamed response body what has already
// arrived but not been read. A request whose context carries a Body (With)
// and goes through a Transport gets its response body read through it.
//
// A read that may wait for the peer goes straight into the caller's
// buffer, so an idle stream holds no buffer of ours; the read after it (the
// rest of a message that has begun to arrive) goes through a pooled buffer
// and takes whatever else has arrived with it. That buffer goes back to
// the pool once read. (A first version that kept a buffer per stream cost
// 4.8 KB more per idle stream: 57.6 against 52.8 KB, docs/benchmarks.md.)
//
// Buffered and Read must be called from one goroutine.
type Body struct {
	body  io.ReadCloser
	buf   *[]byte // pooled; nil while nothing is buffered
	r, w  int
	err   error // the body's error, returned once the buffer is read
	ahead bool  // the next read from the body goes through buf
}

// size is the pooled buffer: one read takes up to this much of
// what has arrived.
const size = 4 << 10

var pool = sync.Pool{New: func() any { b := make([]byte, size); return &b }}

type ctxKey struct{}

// With returns ctx carrying l.
func With(ctx context.Context, l *Body) context.Context {
	return context.WithValue(ctx, ctxKey{}, l)
}

// Buffered returns the bytes that arrived and were not read yet, without
// blocking; the slice is valid until the next read.
func (l *Body) Buffered() []byte {
	if l == nil || l.buf == nil {
		return nil
	}
	return (*l.buf)[l.r:l.w]
}

func (l *Body) read(p []byte) (int, error) {
	if l.buf != nil {
		n := copy(p, (*l.buf)[l.r:l.w])
		l.r += n
		if l.r == l.w {
			pool.Put(l.buf)
			l.buf = nil
		}
		return n, nil
	}
	if l.err != nil {
		return 0, l.err
	}
	if !l.ahead || len(p) >= size {
		n, err := l.body.Read(p)
		l.ahead = n > 0
		return n, err
	}
	l.ahead = false
	b := pool.Get().(*[]byte)
	n, err := l.body.Read(*b)
	l.err = err
	if n == 0 {
		pool.Put(b)
		return 0, err
	}
	l.buf, l.r, l.w = b, 0, n
	return l.read(p)
}

// Transport is an http.RoundTripper that reads the response body of a
// request carrying a Body through it; other requests pass through
// unchanged.
type Transport struct{ http.RoundTripper }

func (t Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := t.RoundTripper.RoundTrip(r)
	if err != nil {
		return res, err
	}
	if l, ok := r.Context().Value(ctxKey{}).(*Body); ok && l != nil {
		l.body = res.Body
		res.Body = reader{l}
	}
	return res, nil
}

// CloseIdleConnections reaches the wrapped transport's.
func (t Transport) CloseIdleConnections() {
	if c, ok := t.RoundTripper.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

type reader struct{ l *Body }

func (b reader) Read(p []byte) (int, error) { return b.l.read(p) }

// Close closes the body; a buffer still held is left to the collector
// (Close may come from another goroutine than the reads).
func (b reader) Close() error { return b.l.body.Close() }
