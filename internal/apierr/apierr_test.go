package apierr_test

import (
	"errors"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/cohort-dev/cohort/internal/apierr"
)

// TestConnectRoundTrip: what one Cohort process sends over Connect, another
// reads back with the same status, reason and message.
func TestConnectRoundTrip(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err  *apierr.Error
		code connect.Code
	}{
		{apierr.BadRequest("bad"), connect.CodeInvalidArgument},
		{apierr.Unauthenticated("who"), connect.CodeUnauthenticated},
		{apierr.Forbidden("no"), connect.CodePermissionDenied},
		{apierr.NotFound("gone"), connect.CodeNotFound},
		{apierr.New(404, "interaction_unknown", "x"), connect.CodeNotFound},
		{apierr.Conflict("busy", "x"), connect.CodeFailedPrecondition},
		{apierr.New(410, "attachment_failed", "x"), connect.CodeOutOfRange},
		{apierr.New(413, "payload_too_large", "x"), connect.CodeResourceExhausted},
		{apierr.New(429, "rate_limited", "x"), connect.CodeResourceExhausted},
		{apierr.New(502, "intern_unreachable", "x"), connect.CodeUnavailable},
		{apierr.New(503, "busy", "x"), connect.CodeUnavailable},
		{apierr.New(504, "timeout", "x"), connect.CodeDeadlineExceeded},
	}
	for _, c := range cases {
		ce := apierr.ToConnect(c.err)
		if connect.CodeOf(ce) != c.code {
			t.Errorf("%v: code %v, want %v", c.err, connect.CodeOf(ce), c.code)
		}
		back := apierr.FromConnect(ce)
		if back.Status != c.err.Status || back.Reason != c.err.Reason || back.Message != c.err.Message {
			t.Errorf("round trip %v → %+v", c.err, back)
		}
	}
	// Anything that is not an *Error is an internal error with no detail shown.
	ce := apierr.ToConnect(errors.New("dial tcp 10.0.0.1: secret"))
	var cerr *connect.Error
	if !errors.As(ce, &cerr) || cerr.Message() != "internal error" || connect.CodeOf(ce) != connect.CodeInternal {
		t.Fatalf("%v", ce)
	}
	// A Connect error from elsewhere without our detail keeps a status from its code.
	if got := apierr.FromConnect(connect.NewError(connect.CodeUnavailable, errors.New("down"))); got.Status != http.StatusServiceUnavailable {
		t.Fatalf("%+v", got)
	}
}
