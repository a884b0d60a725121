package httpx

import (
	"context"
	"io"
	"net/http"
	"sync"
)

// Lookahead shows the reader of one streamed response body what has already
// arrived but not been read, so a relay can send everything that is waiting
// in one write without ever holding back what is not. A request whose
// context carries a Lookahead (WithLookahead) and goes through a
// LookaheadTransport gets its response body read through it.
//
// A read that may wait for the peer goes straight into the caller's
// buffer, so an idle stream holds no buffer of ours; the read after it (the
// rest of a message that has begun to arrive) goes through a pooled buffer
// and takes whatever else has arrived with it. That buffer goes back to
// the pool once read.
//
// Buffered and Read must be called from one goroutine.
type Lookahead struct {
	body  io.ReadCloser
	buf   *[]byte // pooled; nil while nothing is buffered
	r, w  int
	err   error // the body's error, returned once the buffer is read
	ahead bool  // the next read from the body goes through buf
}

// lookaheadSize is the pooled buffer: one read takes up to this much of
// what has arrived.
const lookaheadSize = 4 << 10

var lookaheadPool = sync.Pool{New: func() any { b := make([]byte, lookaheadSize); return &b }}

type lookaheadKey struct{}

// WithLookahead returns ctx carrying l.
func WithLookahead(ctx context.Context, l *Lookahead) context.Context {
	return context.WithValue(ctx, lookaheadKey{}, l)
}

// Buffered returns the bytes that arrived and were not read yet, without
// blocking; the slice is valid until the next read.
func (l *Lookahead) Buffered() []byte {
	if l == nil || l.buf == nil {
		return nil
	}
	return (*l.buf)[l.r:l.w]
}

func (l *Lookahead) read(p []byte) (int, error) {
	if l.buf != nil {
		n := copy(p, (*l.buf)[l.r:l.w])
		l.r += n
		if l.r == l.w {
			lookaheadPool.Put(l.buf)
			l.buf = nil
		}
		return n, nil
	}
	if l.err != nil {
		return 0, l.err
	}
	if !l.ahead || len(p) >= lookaheadSize {
		n, err := l.body.Read(p)
		l.ahead = n > 0
		return n, err
	}
	l.ahead = false
	b := lookaheadPool.Get().(*[]byte)
	n, err := l.body.Read(*b)
	l.err = err
	if n == 0 {
		lookaheadPool.Put(b)
		return 0, err
	}
	l.buf, l.r, l.w = b, 0, n
	return l.read(p)
}

// LookaheadTransport is an http.RoundTripper that reads the response body
// of a request carrying a Lookahead through it; other requests pass
// through unchanged.
type LookaheadTransport struct{ http.RoundTripper }

func (t LookaheadTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := t.RoundTripper.RoundTrip(r)
	if err != nil {
		return res, err
	}
	if l, ok := r.Context().Value(lookaheadKey{}).(*Lookahead); ok && l != nil {
		l.body = res.Body
		res.Body = lookaheadBody{l}
	}
	return res, nil
}

// CloseIdleConnections reaches the wrapped transport's.
func (t LookaheadTransport) CloseIdleConnections() {
	if c, ok := t.RoundTripper.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

type lookaheadBody struct{ l *Lookahead }

func (b lookaheadBody) Read(p []byte) (int, error) { return b.l.read(p) }

// Close closes the body; a buffer still held is left to the collector
// (Close may come from another goroutine than the reads).
func (b lookaheadBody) Close() error { return b.l.body.Close() }
