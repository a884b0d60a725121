// Package apierr is Cohort's one error model. A domain error carries the
// HTTP status and the spec's reason, a message safe to show clients, and an
// internal cause that only reaches logs. Each door (Connect, REST, SSE) maps
// it once, at the edge.
package apierr

import (
	"errors"
	"fmt"
	"net/http"
)

// Error is a failure that a client may see.
type Error struct {
	Status  int    // HTTP status on the REST door
	Reason  string // the spec's reason, or "" where the spec's body has none
	Message string // safe for clients: never a secret, never an internal detail
	Cause   error  // logged, never shown
	// RetryAfter, when positive, is sent as Retry-After (seconds) on both
	// doors: when a refused caller may try again.
	RetryAfter int
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%d %s: %s: %v", e.Status, e.Reason, e.Message, e.Cause)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Reason, e.Message)
}

func (e *Error) Unwrap() error { return e.Cause }

// New returns an error with a status, reason and client-safe message.
func New(status int, reason, format string, args ...any) *Error {
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
	return New(http.StatusBadRequest, "bad_request", format, args...)
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
	return New(http.StatusNotFound, "not_found", format, args...)
}

// Conflict is a 409 with the given reason.
func Conflict(reason, format string, args ...any) *Error {
	return New(http.StatusConflict, reason, format, args...)
}

// Internal wraps an unexpected failure. The client sees only "internal error".
func Internal(cause error) *Error {
	return &Error{Status: http.StatusInternalServerError, Reason: "internal", Message: "internal error", Cause: cause}
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
func Is(err error, status int, reason string) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status && e.Reason == reason
}
