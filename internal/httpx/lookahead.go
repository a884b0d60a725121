package httpx

import (
	"bufio"
	"context"
	"io"
	"net/http"
)

// Lookahead shows the reader of one streamed response body what has already
// arrived but not been read, so a relay can send everything that is waiting
// in one write without ever holding back what is not. A request whose
// context carries a Lookahead (WithLookahead) and goes through a
// LookaheadTransport gets its response body read through it.
//
// Buffered and the body's reads must come from one goroutine.
type Lookahead struct{ br *bufio.Reader }

// lookaheadSize is the read buffer of a body: one read takes up to this
// much of what has arrived. It is held for the life of the stream.
const lookaheadSize = 4 << 10

type lookaheadKey struct{}

// WithLookahead returns ctx carrying l.
func WithLookahead(ctx context.Context, l *Lookahead) context.Context {
	return context.WithValue(ctx, lookaheadKey{}, l)
}

// Buffered returns the bytes that arrived and were not read yet, without
// blocking; the slice is valid until the next read.
func (l *Lookahead) Buffered() []byte {
	if l == nil || l.br == nil {
		return nil
	}
	b, _ := l.br.Peek(l.br.Buffered())
	return b
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
		l.br = bufio.NewReaderSize(res.Body, lookaheadSize)
		res.Body = bufferedBody{l.br, res.Body}
	}
	return res, nil
}

// CloseIdleConnections reaches the wrapped transport's.
func (t LookaheadTransport) CloseIdleConnections() {
	if c, ok := t.RoundTripper.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

type bufferedBody struct {
	*bufio.Reader
	io.Closer
}
