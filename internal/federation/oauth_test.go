package federation

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/accesslog"
	"github.com/cohort-dev/cohort/internal/apierr"
)

// The token endpoint's refusals are *apierr.Error values whose reason is
// the RFC 6749 error code; the door writes each as the spec's body, with
// its status and headers. Anything else is 500 server_error, logged: an
// outage as one, a bug as a bug.
func TestOAuthBodiesFromAPIErrors(t *testing.T) {
	t.Parallel()
	tooMany := apierr.New(http.StatusTooManyRequests, ReasonInvalidRequest, "too many token exchanges from this address; retry later")
	tooMany.RetryAfter = 7
	cases := []struct {
		name       string
		err        error
		status     int
		body       string
		retryAfter string
		logged     string // "" (not logged), "outage" or "bug"
	}{
		{"invalid_request", invalidRequest("grant_type is required"), 400,
			`{"error":"invalid_request","error_description":"grant_type is required"}`, "", ""},
		{"invalid_grant", errInvalidGrant, 400,
			`{"error":"invalid_grant","error_description":"` + invalidGrantDescription + `"}`, "", ""},
		{"unsupported_grant_type", apierr.New(400, ReasonUnsupportedGrantType, "grant_type must be %s", GrantTokenExchange), 400,
			`{"error":"unsupported_grant_type","error_description":"grant_type must be ` + GrantTokenExchange + `"}`, "", ""},
		{"invalid_scope", apierr.New(400, ReasonInvalidScope, "the only scope is inference"), 400,
			`{"error":"invalid_scope","error_description":"the only scope is inference"}`, "", ""},
		{"temporarily_unavailable", errTemporarilyUnavailable, 503,
			`{"error":"temporarily_unavailable","error_description":"the identity provider's keys could not be fetched; retry shortly"}`, "2", ""},
		{"rate limited", tooMany, 429,
			`{"error":"invalid_request","error_description":"too many token exchanges from this address; retry later"}`, "7", ""},
		{"wrapped", errors.Join(errors.New("context"), errInvalidGrant), 400,
			`{"error":"invalid_grant","error_description":"` + invalidGrantDescription + `"}`, "", ""},
		{"outage", apierr.Internal(errors.New("database is closed")), 500,
			`{"error":"server_error","error_description":"internal error"}`, "", "outage"},
		{"plain error", errors.New("dial tcp: connection refused"), 500,
			`{"error":"server_error","error_description":"internal error"}`, "", "outage"},
		{"not an OAuth reason", apierr.NotFound("policy not found"), 500,
			`{"error":"server_error","error_description":"internal error"}`, "", "outage"},
		{"bug", apierr.Bug("signing key %s does not encode", "k1"), 500,
			`{"error":"server_error","error_description":"internal error"}`, "", "bug"},
	}
	for _, c := range cases {
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		r := httptest.NewRequest(http.MethodPost, "/api/v1/oauth/token", nil)
		r = r.WithContext(accesslog.WithLogger(r.Context(), log))
		w := httptest.NewRecorder()
		writeOAuth(w, r, c.err)
		if w.Code != c.status || strings.TrimSpace(w.Body.String()) != c.body {
			t.Errorf("%s: %d %s, want %d %s", c.name, w.Code, w.Body, c.status, c.body)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", c.name, ct)
		}
		if got := w.Header().Get("Retry-After"); got != c.retryAfter {
			t.Errorf("%s: Retry-After %q, want %q", c.name, got, c.retryAfter)
		}
		out := logs.String()
		switch c.logged {
		case "":
			if out != "" {
				t.Errorf("%s: logged %s", c.name, out)
			}
		case "outage":
			if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, `msg="request failed"`) || strings.Contains(out, "bug") {
				t.Errorf("%s: log %s", c.name, out)
			}
		case "bug":
			if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, `msg="request failed: bug"`) || !strings.Contains(out, "bug=true") ||
				!strings.Contains(out, "signing key k1 does not encode") {
				t.Errorf("%s: log %s", c.name, out)
			}
		}
	}
}

// The door's own refusals, before any exchange work, go the same way and
// keep the no-store headers.
func TestTokenDoorRefusals(t *testing.T) {
	t.Parallel()
	h := REST{}
	cases := []struct {
		name, method, ctype, encoding, body string
		status                              int
		code, allow                         string
	}{
		{"method", http.MethodGet, "", "", "", 405, "invalid_request", "POST"},
		{"too large", http.MethodPost, "application/x-www-form-urlencoded", "", strings.Repeat("a", MaxTokenBody+1), 413, "invalid_request", ""},
		{"encoding", http.MethodPost, "application/x-www-form-urlencoded", "gzip", "x", 400, "invalid_request", ""},
		{"content type", http.MethodPost, "application/json", "", "{}", 400, "invalid_request", ""},
		{"grant type", http.MethodPost, "application/x-www-form-urlencoded", "", "grant_type=password", 400, "unsupported_grant_type", ""},
		{"scope", http.MethodPost, "application/x-www-form-urlencoded", "",
			"grant_type=" + GrantTokenExchange + "&subject_token=a.b.c&subject_token_type=" + TokenTypeJWT + "&federation_policy_id=p&scope=admin",
			400, "invalid_scope", ""},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, "/api/v1/oauth/token", strings.NewReader(c.body))
		if c.ctype != "" {
			r.Header.Set("Content-Type", c.ctype)
		}
		if c.encoding != "" {
			r.Header.Set("Content-Encoding", c.encoding)
		}
		w := httptest.NewRecorder()
		h.Token(w, r)
		if w.Code != c.status || !strings.Contains(w.Body.String(), `"error":"`+c.code+`"`) || !strings.Contains(w.Body.String(), `"error_description":"`) {
			t.Errorf("%s: %d %s, want %d %s", c.name, w.Code, w.Body, c.status, c.code)
		}
		if w.Header().Get("Cache-Control") != "no-store" || w.Header().Get("Pragma") != "no-cache" || w.Header().Get("Allow") != c.allow {
			t.Errorf("%s: headers %v", c.name, w.Header())
		}
	}
}
