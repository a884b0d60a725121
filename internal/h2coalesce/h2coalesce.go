// Package h2coalesce dials connections on which an HTTP/2 client sends a
// request's HEADERS frame in the same write as its body.
//
// Its figure (docs/benchmarks.md as of 233a0f0, "Chat, round 4", "Then: one write per
// daemon call"): the gateway-alone time to first chunk, four pairs of runs
// alternating the binaries, paired medians 252, 254, 282 and 323 µs
// without it and 240, 240, 269 and 271 µs with it, lower in every pair. A
// first version that backed the hold with a timer showed no gain:
// resetting the timer woke the runtime's poller on two calls in three
// (strace), so nothing but the next write ends a hold.
package h2coalesce

import (
	"context"
	"net"
	"sync"
)

// HTTP/2 frame header fields (RFC 9113, section 4.1).
const (
	h2FrameHeaderLen = 9
	h2TypeHeaders    = 0x1
	h2FlagEndStream  = 0x1
	h2FlagEndHeaders = 0x4
)

// Dialer dials connections for an HTTP/2 client on which a
// request's HEADERS frame goes out in the same write as the body that
// follows it. Go's HTTP/2 client flushes the headers of a request with a
// body on their own and then the body, so each call costs two writes and
// wakes the server twice.
//
// A write that is exactly one HEADERS frame without END_STREAM is held
// until the next write. That is only safe for a client whose requests
// write their body at once: unary and server-streaming calls with an
// in-memory body (Connect's), never a client or bidirectional stream, whose
// headers could then wait for a message the caller has not sent.
func Dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &coalescingConn{Conn: c}, nil
	}
}

type coalescingConn struct {
	net.Conn
	mu   sync.Mutex
	held []byte
}

// loneHeaders reports whether b is exactly one complete HEADERS frame of a
// request whose body follows.
func loneHeaders(b []byte) bool {
	if len(b) < h2FrameHeaderLen {
		return false
	}
	n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
	// A HEADERS frame larger than the default 16 KiB frame size is split
	// into CONTINUATIONs; the bound also keeps TLS records (whose first
	// bytes read as a length over 1 MiB) from ever matching.
	return n <= 1<<14 && len(b) == h2FrameHeaderLen+n && b[3] == h2TypeHeaders &&
		b[4]&h2FlagEndStream == 0 && b[4]&h2FlagEndHeaders != 0
}

func (c *coalescingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held != nil {
		out := append(c.held, b...)
		c.held = nil
		n, err := c.Conn.Write(out)
		return max(0, n-(len(out)-len(b))), err
	}
	if loneHeaders(b) {
		c.held = append(make([]byte, 0, len(b)+512), b...)
		return len(b), nil
	}
	return c.Conn.Write(b)
}
