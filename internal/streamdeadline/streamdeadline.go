// Package streamdeadline gives streaming RPCs a deadline per write in place
// of the server's request-wide timeouts.
package streamdeadline

import (
	"net/http"
	"strings"
	"time"
)

// Handler lifts the server's request-wide read and write timeouts
// for streaming RPCs (the Connect streaming protocol and gRPC), which last
// as long as their turn, and gives each write its own deadline instead, so
// a stuck client still cannot hold a goroutine for ever. Other requests
// pass untouched. (The SSE door does the same in internal/sse.)
func Handler(h http.Handler, perWrite time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !streaming(r.Header.Get("Content-Type")) {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		// A leftover read deadline would fail the connection's background
		// read mid-stream and cancel the request.
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		h.ServeHTTP(&deadlineWriter{ResponseWriter: w, rc: rc, d: perWrite}, r)
	})
}

func streaming(contentType string) bool {
	return strings.HasPrefix(contentType, "application/connect+") || strings.HasPrefix(contentType, "application/grpc")
}

// deadlineWriter sets a fresh write deadline before each write and flush.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.ResponseWriter.Write(b)
}

func (w *deadlineWriter) Flush() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
