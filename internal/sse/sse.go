// Package sse is the adapter between the chat chunk stream and the
// OpenAI-style server-sent events of the REST door. It only translates: each
// chunk becomes one `data: <json>` event, silence becomes `: keepalive`
// comments, and the end of the stream becomes `data: [DONE]`. What the chunks
// say is decided by the chat orchestration, never here.
package sse

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
)

// Defaults of Options.
const (
	// DefaultKeepalive is the spec's 30 seconds of silence.
	DefaultKeepalive = 30 * time.Second
	// DefaultWriteTimeout bounds one write to a slow or vanished client.
	DefaultWriteTimeout = 30 * time.Second
)

// Wire constants of the stream.
var (
	keepalive = []byte(": keepalive\n\n")
	done      = []byte("data: [DONE]\n\n")
)

// Source yields the chunks of one response. Next returns io.EOF after the
// last chunk; any other error means the stream stops without a sentinel
// (the caller is gone, so nothing more can be delivered).
type Source interface {
	Next() (*cohortv1.ChatCompletionChunk, error)
}

// Direct is a Source that Serve may read from the handler's own goroutine,
// with no pump goroutine between them: its Next returns promptly once the
// request's context ends, Close makes a blocked Next return, and Ready
// reports whether Next has a chunk without blocking (so chunks that are
// ready together go out in one write). Keepalives then come from a timer.
type Direct interface {
	Source
	Ready() bool
	Close()
}

// Options tune a stream; zero values take the defaults.
type Options struct {
	// Keepalive is the silence after which a `: keepalive` comment is
	// written, so a disconnected caller is noticed within that interval.
	Keepalive time.Duration
	// WriteTimeout is the deadline of each write (and its flush).
	WriteTimeout time.Duration
}

func (o Options) keepalive() time.Duration {
	if o.Keepalive > 0 {
		return o.Keepalive
	}
	return DefaultKeepalive
}

func (o Options) writeTimeout() time.Duration {
	if o.WriteTimeout > 0 {
		return o.WriteTimeout
	}
	return DefaultWriteTimeout
}

// Event frames one chunk as a `data:` event.
func Event(b []byte, c *cohortv1.ChatCompletionChunk) []byte {
	b = append(b, "data: "...)
	b = AppendChunk(b, c)
	return append(b, '\n', '\n')
}

type item struct {
	c   *cohortv1.ChatCompletionChunk
	err error
}

// Serve writes src to w as server-sent events until src ends (then
// `data: [DONE]`), the request's context ends, or a write fails. It sends
// the 200 status and the headers that keep proxies from buffering. It
// returns nil after [DONE], else the reason the stream stopped early. For a
// Direct source the last chunks and [DONE] are written but not flushed: the
// server flushes them with the end of the body when the handler returns,
// which it must do at once.
//
// The server-wide read and write deadlines are cleared for the stream (a
// stream outlives any request timeout); instead each write gets its own
// deadline, so one stuck client cannot hold a goroutine for ever.
func Serve(w http.ResponseWriter, r *http.Request, src Source, opt Options) error {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	// A read deadline left over from the server's ReadTimeout would make the
	// connection's background read fail mid-stream and cancel the request.
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	if d, ok := src.(Direct); ok {
		return serveDirect(w, rc, d, opt)
	}

	items := make(chan item, 16)
	stop := make(chan struct{})
	defer close(stop)
	go pump(src, items, stop)

	write := func(b []byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(opt.writeTimeout()))
		if _, err := w.Write(b); err != nil {
			return err
		}
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		return nil
	}

	idle := time.NewTimer(opt.keepalive())
	defer idle.Stop()
	var buf []byte
	for {
		select {
		case it := <-items:
			// Take every chunk that is already waiting, then write and
			// flush once: a caller that lags behind a fast intern costs one
			// write (and one deadline reset) per batch, not per chunk.
			buf = buf[:0]
			for {
				if it.err != nil {
					if len(buf) > 0 {
						if err := write(buf); err != nil {
							return err
						}
					}
					if it.err == io.EOF {
						return write(done)
					}
					return it.err
				}
				buf = Event(buf, it.c)
				more := false
				if len(buf) < maxBatch {
					select {
					case it = <-items:
						more = true
					default:
					}
				}
				if !more {
					break
				}
			}
			if err := write(buf); err != nil {
				return err
			}
		case <-idle.C:
			if err := write(keepalive); err != nil {
				return err
			}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		idle.Reset(opt.keepalive())
	}
}

// maxBatch bounds the bytes written in one batch.
const maxBatch = 32 << 10

func pump(src Source, out chan<- item, stop <-chan struct{}) {
	for {
		c, err := src.Next()
		select {
		case out <- item{c, err}:
		case <-stop:
			return
		}
		if err != nil {
			return
		}
	}
}

// serveDirect is Serve for a Direct source: one goroutine per stream reads
// the source and writes, and a timer writes the keepalives of a silent
// stream. mu orders the two writers; a failed keepalive closes the source
// so the blocked Next returns and the stream ends with that error.
func serveDirect(w http.ResponseWriter, rc *http.ResponseController, src Direct, opt Options) error {
	var (
		mu      sync.Mutex
		last    = time.Now()
		stopped bool
		kaErr   error
		buf     []byte
	)
	// send is called with mu held; write is send with a flush.
	send := func(b []byte, flush bool) error {
		_ = rc.SetWriteDeadline(time.Now().Add(opt.writeTimeout()))
		last = time.Now()
		if _, err := w.Write(b); err != nil {
			return err
		}
		if !flush {
			return nil
		}
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		return nil
	}
	write := func(b []byte) error { return send(b, true) }
	every := opt.keepalive()
	var ka *time.Timer
	ka = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped || kaErr != nil {
			return
		}
		if idle := time.Since(last); idle < every {
			// A chunk went out since the timer was set.
			ka.Reset(every - idle)
			return
		}
		if err := write(keepalive); err != nil {
			kaErr = err
			src.Close()
			return
		}
		ka.Reset(every)
	})
	defer func() {
		mu.Lock()
		stopped = true
		ka.Stop()
		mu.Unlock()
	}()
	for {
		c, err := src.Next()
		mu.Lock()
		if kaErr != nil {
			err := kaErr
			mu.Unlock()
			return err
		}
		if err != nil {
			defer mu.Unlock()
			if err == io.EOF {
				return write(done)
			}
			return err
		}
		// Take every chunk that is ready too (the role chunk and the first
		// content chunk, say), then write and flush once.
		buf = Event(buf[:0], c)
		for len(buf) < maxBatch && src.Ready() {
			c, err = src.Next()
			if err != nil {
				break
			}
			buf = Event(buf, c)
		}
		if err == io.EOF {
			// The end goes out with the last chunks, unflushed: the server
			// flushes it with the response's terminating chunk when the
			// handler returns, one write instead of two.
			werr := send(append(buf, done...), false)
			mu.Unlock()
			return werr
		}
		werr := write(buf)
		if werr == nil && err != nil {
			mu.Unlock()
			return err
		}
		mu.Unlock()
		if werr != nil {
			return werr
		}
	}
}
