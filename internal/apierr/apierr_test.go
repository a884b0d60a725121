package apierr_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/emptypb"

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

// A handler ending because its caller hung up is not logged as a server
// fault; a real fault still is.
func TestInterceptorCallerGone(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ic := apierr.ConnectInterceptor(log)
	call := func(ctx context.Context, err error) {
		h := ic.WrapUnary(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) { return nil, err })
		h(ctx, connect.NewRequest(&emptypb.Empty{}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	call(ctx, context.Canceled)
	if strings.Contains(buf.String(), "level=ERROR") || !strings.Contains(buf.String(), "status=499") {
		t.Fatalf("caller gone: %s", buf.String())
	}
	buf.Reset()
	call(context.Background(), errors.New("disk full"))
	if !strings.Contains(buf.String(), "level=ERROR") || !strings.Contains(buf.String(), "status=500") {
		t.Fatalf("fault: %s", buf.String())
	}
}
