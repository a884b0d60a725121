// Package accesslog is the gateway's outermost handler: one log line per
// request (and the metrics' observer), and the request logger it puts in
// the context for the handlers below, with LogFault for their server-side
// failures.
package accesslog

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/cohort-dev/cohort/internal/apierr"
)

type loggerKey struct{}

// WithLogger returns ctx carrying the request logger.
func WithLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, l)
}

// LoggerFrom returns the logger in ctx, or slog's default.
func LoggerFrom(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}

// LogFault logs a server-side failure with its internal cause (apierr's
// LogFault: an outage, or a bug with bug=true). Bodies and headers are
// never logged: they may hold keys or secret values.
func LogFault(r *http.Request, e *apierr.Error) {
	apierr.LogFault(r.Context(), LoggerFrom(r.Context()), e, slog.String("method", r.Method), slog.String("path", r.URL.Path))
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Flush lets streaming handlers that need an http.Flusher directly (Connect
// server streams) flush through the access log.
func (s *statusWriter) Flush() {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	_ = http.NewResponseController(s.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach Flush and deadlines.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Handler logs one line per request: method, path, status, duration. A
// client that hung up before an answer is logged as 499. observe, when
// set, is told the same, with the route pattern that served the request
// (metrics).
func Handler(l *slog.Logger, next http.Handler, observe func(route, method string, status int, took time.Duration)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		r2 := r.WithContext(WithLogger(r.Context(), l))
		next.ServeHTTP(sw, r2)
		status := sw.status
		if status == 0 && r.Context().Err() != nil {
			status = 499
		}
		took := time.Since(start)
		l.LogAttrs(r.Context(), slog.LevelInfo, "http",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", status), slog.Duration("duration", took))
		if observe != nil {
			observe(r2.Pattern, r.Method, status, took)
		}
	})
}
