package apierr_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// A bug (a state that cannot happen) answers like any internal error but is
// logged apart from an outage, on both the Connect door and LogFault.
func TestBugLogsApartFromOutage(t *testing.T) {
	t.Parallel()
	outage := apierr.Internal(errors.New("database is closed"))
	bug := apierr.Bug("vault %s belongs to another organization than its owner", "v1")
	// The client sees the same for both.
	for _, e := range []*apierr.Error{outage, bug} {
		if e.Status != http.StatusInternalServerError || e.Reason != "internal" || e.Message != "internal error" {
			t.Fatalf("%+v", e)
		}
		var ce *connect.Error
		if err := apierr.ToConnect(e); !errors.As(err, &ce) || ce.Message() != "internal error" || ce.Code() != connect.CodeInternal {
			t.Fatalf("%v", err)
		}
	}
	if apierr.IsBug(outage) || !apierr.IsBug(bug) || !apierr.IsBug(fmt.Errorf("loading: %w", bug)) {
		t.Fatal("IsBug")
	}
	// A bug wrapped as an internal error on its way up stays a bug.
	if !apierr.Internal(fmt.Errorf("issue: %w", bug)).Bug || !apierr.From(fmt.Errorf("x: %w", bug)).Bug {
		t.Fatal("a wrapped bug is no longer one")
	}
	if wrapped := apierr.Bug("keys: %w", io.ErrUnexpectedEOF); !errors.Is(wrapped, io.ErrUnexpectedEOF) {
		t.Fatalf("%v does not wrap its cause", wrapped)
	}

	logOf := func(f func(log *slog.Logger)) map[string]any {
		var buf bytes.Buffer
		f(slog.New(slog.NewJSONHandler(&buf, nil)))
		var m map[string]any
		if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
			t.Fatalf("%q: %v", buf.String(), err)
		}
		return m
	}
	check := func(where string, m map[string]any, isBug bool) {
		t.Helper()
		wantMsg := "request failed"
		if isBug {
			wantMsg = "request failed: bug"
		}
		if m["level"] != "ERROR" || m["msg"] != wantMsg || m["status"] != float64(500) || m["reason"] != "internal" {
			t.Fatalf("%s: %v", where, m)
		}
		if b, ok := m["bug"]; ok != isBug || (isBug && b != true) {
			t.Fatalf("%s: bug attribute %v in %v", where, b, m)
		}
	}
	ctx := context.Background()
	check("outage", logOf(func(l *slog.Logger) { apierr.LogFault(ctx, l, outage, slog.String("path", "/x")) }), false)
	m := logOf(func(l *slog.Logger) { apierr.LogFault(ctx, l, bug, slog.String("path", "/x")) })
	check("bug", m, true)
	if m["path"] != "/x" || !strings.Contains(fmt.Sprint(m["err"]), "bug: vault v1 belongs to another organization") {
		t.Fatalf("bug: %v", m)
	}
	// The Connect door logs the same way.
	for _, c := range []struct {
		err   error
		isBug bool
	}{{outage, false}, {bug, true}} {
		m := logOf(func(l *slog.Logger) {
			h := apierr.ConnectInterceptor(l).WrapUnary(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) { return nil, c.err })
			h(ctx, connect.NewRequest(&emptypb.Empty{}))
		})
		check("connect", m, c.isBug)
	}
}
