// Package apierr is Cohort's one error model. A domain error carries the
// HTTP status and the spec's reason, a message safe to show clients, and an
// internal cause that only reaches logs. Each door (Connect, REST, SSE, the
// RFC 6749 body of /oauth/token, the http_request tool's answer to the
// model) maps it once, at the edge.
//
// A server-side failure is one of two kinds, answered alike (500
// "internal error") and logged apart (LogFault): an outage, where something
// we depend on failed (Internal: a database error, a disk), and a bug, a
// state our own code says cannot happen (Bug).
package apierr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Error is a failure that a client may see.
type Error struct {
	Status  int    // HTTP status on the REST door
	Reason  Reason // the spec's reason, or "" where the spec's body has none
	Message string // safe for clients: never a secret, never an internal detail
	Cause   error  // logged, never shown
	// RetryAfter, when positive, is sent as Retry-After (seconds) on both
	// doors: when a refused caller may try again.
	RetryAfter int
	// Bug marks a state that cannot happen (Bug), as opposed to an outage:
	// LogFault says so, so that a bug is not read as a database going away.
	Bug bool
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%d %s: %s: %v", e.Status, e.Reason, e.Message, e.Cause)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Reason, e.Message)
}

func (e *Error) Unwrap() error { return e.Cause }

// Reason is the machine-readable reason of an error: the REST body's
// error.metadata.reason, Connect's ErrorDetail.reason, a stream's error
// chunk's. Code names a reason by its constant and compares constants;
// on the wire it is the string (ADR 0953).
type Reason string

// The reasons. The spec's (api-v1.md, "Errors") first, then Cohort's own.
const (
	ReasonAttachmentFailed      Reason = "attachment_failed"
	ReasonBadRequest            Reason = "bad_request"
	ReasonBusy                  Reason = "busy"
	ReasonClientClosedRequest   Reason = "client_closed_request"
	ReasonInteractionNotPending Reason = "interaction_not_pending"
	ReasonInteractionUnknown    Reason = "interaction_unknown"
	ReasonInternNotReady        Reason = "intern_not_ready"
	ReasonInternRejected        Reason = "intern_rejected"
	ReasonInternUnreachable     Reason = "intern_unreachable"
	ReasonNotFound              Reason = "not_found"
	ReasonPayloadTooLarge       Reason = "payload_too_large"
	ReasonRateLimited           Reason = "rate_limited"
	ReasonRunEnded              Reason = "run_ended"
	ReasonStreamSevered         Reason = "stream_severed"
	ReasonTimeout               Reason = "timeout"
	ReasonTurnFailed            Reason = "turn_failed"

	ReasonConflict            Reason = "conflict"
	ReasonForbidden           Reason = "forbidden"
	ReasonHostNotAllowed      Reason = "host_not_allowed"
	ReasonInternal            Reason = "internal"
	ReasonMethodNotAllowed    Reason = "method_not_allowed"
	ReasonRegionalHost        Reason = "regional_host"
	ReasonSecretUnbound       Reason = "secret_unbound"
	ReasonTooManyEndpoints    Reason = "too_many_endpoints"
	ReasonUnavailable         Reason = "unavailable"
	ReasonVaultWritesDisabled Reason = "vault_writes_disabled"
)

// Retry-After values (seconds) of refusals whose end is not known in
// advance (ADR 0020).
const (
	// RetryBusySession: another turn runs in the session (409 busy).
	RetryBusySession = 1
	// RetryPaused: the paused runs of an intern, or of its caller, are at
	// their bound (503 busy); a slot frees when a question is answered,
	// cancelled or expires.
	RetryPaused = 5
	// RetryNoRoom: every awake intern is busy and the host runs as many
	// as it may (503 busy on a wake).
	RetryNoRoom = 5
	// RetryUnavailable: something the request needs (the database, an
	// identity provider) did not answer (503).
	RetryUnavailable = 2
)

// Retry returns a copy of e that says when to retry (Retry-After).
func (e *Error) Retry(seconds int) *Error {
	c := *e
	c.RetryAfter = seconds
	return &c
}

// New returns an error with a status, reason and client-safe message.
func New(status int, reason Reason, format string, args ...any) *Error {
	return &Error{Status: status, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// WithCause returns a copy of e that carries cause for the logs.
func (e *Error) WithCause(cause error) *Error {
	c := *e
	c.Cause = cause
	return &c
}

// BadRequest is a 400 with reason bad_request and a message naming the problem.
func BadRequest(format string, args ...any) *Error {
	return New(http.StatusBadRequest, ReasonBadRequest, format, args...)
}

// Unauthenticated is the 401 for a missing or invalid credential.
func Unauthenticated(format string, args ...any) *Error {
	return New(http.StatusUnauthorized, "", format, args...)
}

// Forbidden is a 403 without a reason.
func Forbidden(format string, args ...any) *Error {
	return New(http.StatusForbidden, "", format, args...)
}

// NotFound is a 404 with reason not_found.
func NotFound(format string, args ...any) *Error {
	return New(http.StatusNotFound, ReasonNotFound, format, args...)
}

// Conflict is a 409 with the given reason.
func Conflict(reason Reason, format string, args ...any) *Error {
	return New(http.StatusConflict, reason, format, args...)
}

// Internal wraps an unexpected failure of something we depend on (an
// outage: the database, a disk, a peer). The client sees only "internal
// error". A cause that is a bug stays one. A database error that says
// what it is (RegisterClassifier: the database unavailable for now, text
// it cannot store) is answered as that instead.
func Internal(cause error) *Error {
	if f := classify.Load(); f != nil && !IsBug(cause) {
		if e := (*f)(cause); e != nil {
			return e
		}
	}
	return &Error{Status: http.StatusInternalServerError, Reason: ReasonInternal, Message: "internal error", Cause: cause,
		Bug: IsBug(cause)}
}

// Unavailable is the 503 of a request that failed because the database
// could not be reached or was restarting: the client may retry (after
// Retry-After); the request was not at fault.
func Unavailable(cause error) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Reason: ReasonUnavailable,
		Message: "the database is unavailable; retry shortly", Cause: cause, RetryAfter: RetryUnavailable}
}

var classify atomic.Pointer[func(error) *Error]

// RegisterClassifier sets how Internal recognises a database error that
// is not a fault of ours (internal/store registers its drivers' errors:
// Unavailable, or a 400 for text the database cannot hold), so that
// apierr itself links no driver. f returns nil for any other error.
func RegisterClassifier(f func(error) *Error) { classify.Store(&f) }

// Bug is a state that cannot happen: an invariant of our own code or data
// that does not hold. The client sees what Internal shows (500, reason
// internal, "internal error"); LogFault logs it as a bug (bug=true), not as
// an outage. The format may wrap an error with %w.
func Bug(format string, args ...any) *Error {
	return &Error{Status: http.StatusInternalServerError, Reason: ReasonInternal, Message: "internal error",
		Cause: fmt.Errorf("bug: "+format, args...), Bug: true}
}

// IsBug reports whether err is, or wraps, an *Error made by Bug.
func IsBug(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Bug
}

// LogFault logs a server-side failure at error level with its cause, never
// its client's body or headers: an outage as "request failed", a bug as
// "request failed: bug" with bug=true. attrs say where it happened (method
// and path, or the Connect procedure).
func LogFault(ctx context.Context, log *slog.Logger, e *Error, attrs ...slog.Attr) {
	if log == nil || e == nil {
		return
	}
	if e.Reason == ReasonUnavailable {
		LogUnavailable(ctx, log, e.Cause)
		return
	}
	msg := "request failed"
	attrs = append(attrs, slog.Int("status", e.Status), slog.String("reason", string(e.Reason)), slog.Any("err", e.Cause))
	if e.Bug {
		msg = "request failed: bug"
		attrs = append(attrs, slog.Bool("bug", true))
	}
	log.LogAttrs(ctx, slog.LevelError, msg, attrs...)
}

// From returns err as an *Error; anything that is not one becomes Internal,
// so an unexpected failure never shows its text to a client.
func From(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return Internal(err)
}

// Is reports whether err is an *Error with the given status and reason.
func Is(err error, status int, reason Reason) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status && e.Reason == reason
}

// outageGap is how long without a database failure ends an outage, for
// LogUnavailable.
const outageGap = 10 * time.Second

var outage struct {
	sync.Mutex
	last time.Time // the latest failure
}

// LogUnavailable logs "database unavailable" once per outage, not once
// per request: at the first failure, and again only after outageGap
// without one. Each failed request is still in the access log (503).
func LogUnavailable(ctx context.Context, log *slog.Logger, cause error) {
	outage.Lock()
	now := time.Now()
	first := outage.last.IsZero() || now.Sub(outage.last) > outageGap
	outage.last = now
	outage.Unlock()
	if first && log != nil {
		log.ErrorContext(ctx, "database unavailable", "err", cause)
	}
}
