package chat_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/uptrace/bun"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/turn"
)

func exec(t *testing.T, db *bun.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatal(err)
	}
}

func TestGates(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db)
		e.d.set(okScript, okScript)
		ok := userBody("hi")

		t.Run("401 without metadata", func(t *testing.T) {
			for _, key := range []string{"", "sk-not-a-key", e.WorkspaceKey + "x"} {
				status, body, _ := e.post(t, key, e.InternID, ok)
				wantRefusal(t, status, body, 401, "")
			}
			// The body's bound comes before authentication (a body past
			// it is never read), and authentication before the body is read.
			status, body, _ := e.post(t, "", e.InternID, padded(t, 1<<20+1))
			wantRefusal(t, status, body, 413, "payload_too_large")
			status, body, _ = e.post(t, "", e.InternID, `{"stream":false}`)
			wantRefusal(t, status, body, 401, "")
		})
		t.Run("404 not_found for an intern the key cannot see", func(t *testing.T) {
			for _, id := range []string{uuid.NewString(), "not-a-uuid"} {
				status, body, _ := e.post(t, e.WorkspaceKey, id, ok)
				wantRefusal(t, status, body, 404, "not_found")
			}
			// An intern of another workspace is not found either.
			other := e.NewKey(t, store.KeyWorkspace, newWorkspace(t, e))
			status, body, _ := e.post(t, other, e.InternID, ok)
			wantRefusal(t, status, body, 404, "not_found")
			// Another organization's management key does not see it either.
			status, body, _ = e.post(t, otherOrgManagementKey(t, e), e.InternID, ok)
			wantRefusal(t, status, body, 404, "not_found")
			// The organization's own management key sees every workspace's.
			if status, body, _ := e.post(t, e.ManagementKey, e.InternID, ok); status != 200 {
				t.Fatalf("management key: %d %s", status, body)
			}
		})
		t.Run("409 intern_not_ready", func(t *testing.T) {
			for _, st := range []string{store.InternProvisioning, store.InternSuspended} {
				e.setState(t, st)
				status, body, _ := e.chat(t, ok)
				wantRefusal(t, status, body, 409, "intern_not_ready")
			}
			e.setState(t, store.InternDeleted)
			status, body, _ := e.chat(t, ok)
			wantRefusal(t, status, body, 404, "not_found")
			e.setState(t, store.InternRunning)
		})
		t.Run("403 departed creator without metadata, allowed with a grant", func(t *testing.T) {
			exec(t, db, "UPDATE memberships SET left_at = ? WHERE user_id = ?", time.Now().UTC(), e.AdminUserID)
			status, body, _ := e.chat(t, ok)
			wantRefusal(t, status, body, 403, "")
			// The 403 comes before the body is looked at.
			status, body, _ = e.chat(t, `{"stream":false}`)
			wantRefusal(t, status, body, 403, "")
			exec(t, db, "INSERT INTO grants (id, organization_id, user_id, created_at) VALUES (?, ?, ?, ?)",
				uuid.NewString(), e.OrganizationID, e.AdminUserID, time.Now().UTC())
			if status, body, _ := e.chat(t, ok); status != 200 {
				t.Fatalf("with a grant: %d %s", status, body)
			}
			exec(t, db, "DELETE FROM grants WHERE user_id = ?", e.AdminUserID)
			exec(t, db, "UPDATE memberships SET left_at = NULL WHERE user_id = ?", e.AdminUserID)
		})
		t.Run("404 without metadata outside the programme", func(t *testing.T) {
			exec(t, db, "UPDATE organizations SET interns_programme = ? WHERE id = ?", false, e.OrganizationID)
			defer exec(t, db, "UPDATE organizations SET interns_programme = ? WHERE id = ?", true, e.OrganizationID)
			n := e.d.ncalls()
			// (A body past the bound is 413 before anything: the bound is
			// the spec's, the same for every caller.)
			for _, body := range []string{ok, `{"stream":false}`} {
				status, b, _ := e.chat(t, body)
				eb := wantRefusal(t, status, b, 404, "")
				if eb.Error.Message != "not found" {
					t.Errorf("message %q reveals more than not found", eb.Error.Message)
				}
			}
			status, b, _ := e.post(t, e.WorkspaceKey, uuid.NewString(), ok)
			wantRefusal(t, status, b, 404, "")
			if e.d.ncalls() != n {
				t.Error("the daemon was called")
			}
		})
		t.Run("secrets stay out of responses and logs", func(t *testing.T) {
			status, body, _ := e.post(t, e.WorkspaceKey+"x", e.InternID, ok)
			if status != 401 || strings.Contains(body, e.WorkspaceKey) || strings.Contains(e.Logs(), e.WorkspaceKey) {
				t.Errorf("key echoed: %s", body)
			}
		})
	})
}

func newWorkspace(t *testing.T, e *env) string {
	t.Helper()
	ws := &store.Workspace{ID: uuid.NewString(), OrganizationID: e.OrganizationID, Name: "other", Slug: "other-" + uuid.NewString()[:8],
		CreatedAt: time.Now().UTC(), CreatedBy: e.AdminUserID}
	if _, err := e.DB.NewInsert().Model(ws).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ws.ID
}

func TestTurnRate(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db, func(s *server.Server) { s.Chat.Limiter = memLimiter(t, 2) })
		e.d.set(okScript, okScript)
		for i := range 2 {
			if status, body, _ := e.chat(t, userBody("hi")); status != 200 {
				t.Fatalf("turn %d: %d %s", i, status, body)
			}
		}
		n := e.d.ncalls()
		status, body, h := e.chat(t, userBody("hi"))
		wantRefusal(t, status, body, 429, "rate_limited")
		// Two turns an hour: the next one is due in half an hour.
		if ra, err := strconv.Atoi(h.Get("Retry-After")); err != nil || ra < 1700 || ra > 1800 {
			t.Errorf("Retry-After %q", h.Get("Retry-After"))
		}
		// The Connect door says the same in the error's metadata.
		_, cerr := connectStream(e, e.WorkspaceKey, &cohortv1.StreamChatCompletionRequest{InternId: e.InternID,
			Messages: []*cohortv1.ChatMessage{{Role: "user", Content: ptr("hi")}}})
		var ce *connect.Error
		if !errors.As(cerr, &ce) || ce.Code() != connect.CodeResourceExhausted || ce.Meta().Get("Retry-After") != h.Get("Retry-After") {
			t.Errorf("connect refusal: %v (Retry-After %q)", cerr, func() string {
				if ce != nil {
					return ce.Meta().Get("Retry-After")
				}
				return ""
			}())
		}
		if e.d.ncalls() != n {
			t.Error("the daemon was called past the limit")
		}
		// Another key of the same organization shares the organization's
		// budget; answers to a pause continue a turn and are not limited.
		other := e.NewKey(t, store.KeyWorkspace, e.WorkspaceID)
		status, body, _ = e.post(t, other, e.InternID, userBody("hi"))
		wantRefusal(t, status, body, 429, "rate_limited")
		if status, body, _ := e.chat(t, toolBody("sess-1", "int-1", "allow_once")); status != 200 {
			t.Errorf("answer past the turn limit: %d %s", status, body)
		}
	})
}

func TestRateKey(t *testing.T) {
	org := &auth.Principal{OrganizationID: "o1", UserID: "u1", KeyKind: store.KeyWorkspace}
	personal := &auth.Principal{OrganizationID: "o1", UserID: "u1", KeyKind: store.KeyPersonal}
	if turn.RateKey(org) != "org:o1" || turn.RateKey(personal) != "user:u1" {
		t.Errorf("%s %s", turn.RateKey(org), turn.RateKey(personal))
	}
}

// memLimiter is the production in-memory limiter allowing n turns an hour.
func memLimiter(t *testing.T, n int) ratelimit.Limiter {
	l, err := ratelimit.NewMemory(ratelimit.Rate{Events: n, Period: time.Hour, Burst: n}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// failingLimiter is a limiter whose backend is down.
type failingLimiter struct{}

func (failingLimiter) Allow(context.Context, string) (bool, time.Duration, error) {
	return false, 0, errors.New("redis: connection refused")
}

// A failed limiter (Redis down) lets turns through and says so in the log.
func TestTurnRateLimiterDown(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t), func(s *server.Server) { s.Chat.Limiter = failingLimiter{} })
	e.d.set(okScript, okScript)
	if status, body, _ := e.chat(t, userBody("hi")); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	if !strings.Contains(e.Logs(), "turn rate limiter failed") {
		t.Error("the limiter failure is not logged")
	}
}

// TestDaemonRefusals covers every refusal the daemon can cause before the
// stream opens: the spec's status, reason and body, nothing streamed.
func TestDaemonRefusals(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db, func(s *server.Server) { s.Chat.FirstEventTimeout = 300 * time.Millisecond })
		prompt, answer := userBody("hi"), toolBody("sess-1", "int-1", "allow_once")
		wait := func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
			<-ctx.Done()
			return ctx.Err()
		}
		cases := []struct {
			name   string
			sc     script
			body   string
			status int
			reason string
		}{
			{"busy turn in session", events(refuse(409, "busy")), prompt, 409, "busy"},
			{"busy too many paused runs", events(refuse(503, "busy")), prompt, 503, "busy"},
			{"turn_failed", events(refuse(502, "turn_failed")), prompt, 502, "turn_failed"},
			{"turn_failed as first event", events(nil, finishedEv("", &interndv1.Finished{Reason: interndv1.Finished_REASON_ERROR, Code: 502, ErrorReason: "turn_failed", Message: "agent refused"})), prompt, 502, "turn_failed"},
			{"intern_rejected", events(refuse(502, "intern_rejected")), prompt, 502, "intern_rejected"},
			{"intern_rejected without detail", events(connect.NewError(connect.CodePermissionDenied, errors.New("bad daemon secret"))), prompt, 502, "intern_rejected"},
			{"timeout from the daemon", events(refuse(504, "timeout")), prompt, 504, "timeout"},
			{"timeout of the request budget", wait, prompt, 504, "timeout"},
			{"stream_severed", events(nil), prompt, 502, "stream_severed"},
			{"bad_request answer", events(refuse(400, "bad_request")), answer, 400, "bad_request"},
			{"interaction_unknown", events(refuse(404, "interaction_unknown")), answer, 404, "interaction_unknown"},
			{"interaction_not_pending", events(refuse(409, "interaction_not_pending")), answer, 409, "interaction_not_pending"},
			{"attachment_failed attached", events(refuse(409, "attachment_failed")), answer, 409, "attachment_failed"},
			{"attachment_failed dropped", events(refuse(410, "attachment_failed")), answer, 410, "attachment_failed"},
			{"busy answer", events(refuse(409, "busy")), answer, 409, "busy"},
			{"timeout of an answer", wait, answer, 504, "timeout"},
		}
		for _, c := range cases {
			e.d.set(c.sc, c.sc)
			status, body, _ := e.chat(t, c.body)
			t.Logf("%s: %s", c.name, body)
			wantRefusal(t, status, body, c.status, c.reason)
			if c.reason == "timeout" && c.status == 504 && c.sc != nil {
				// The daemon call ends; for the budget, by cancellation.
				if err := e.d.waitEnded(t); c.name != "timeout from the daemon" && err == nil {
					t.Errorf("%s: the daemon call was not cancelled", c.name)
				}
			} else {
				e.d.waitEnded(t)
			}
		}
	})
}

func TestUnreachable(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		t.Run("provisioner error", func(t *testing.T) {
			e := newEnv(t, db, func(s *server.Server) { s.Chat.Daemons = daemons{err: errors.New("no address")} })
			status, body, _ := e.chat(t, userBody("hi"))
			eb := wantRefusal(t, status, body, 502, "intern_unreachable")
			if strings.Contains(eb.Error.Message, "no address") {
				t.Error("internal cause shown to the client")
			}
		})
	})
	t.Run("daemon down", func(t *testing.T) {
		db := storetest.SQLite(t)
		e := newEnv(t, db)
		e.d.srv.Close()
		status, body, _ := e.chat(t, userBody("hi"))
		wantRefusal(t, status, body, 502, "intern_unreachable")
		status, body, _ = e.chat(t, toolBody("s", "i", "allow_once"))
		wantRefusal(t, status, body, 502, "intern_unreachable")
	})
	t.Run("no provisioner", func(t *testing.T) {
		db := storetest.SQLite(t)
		e := newEnv(t, db, func(s *server.Server) { s.Chat.Daemons = nil })
		status, body, _ := e.chat(t, userBody("hi"))
		wantRefusal(t, status, body, 502, "intern_unreachable")
	})
}

// tokens stands in for the federation package's verifier: it accepts one
// access token and names the key it acts as.
type tokens struct{ token, keyID string }

func (v tokens) VerifyAccessToken(_ context.Context, tok string) (string, error) {
	if tok != v.token {
		return "", apierr.Unauthenticated("invalid access token")
	}
	return v.keyID, nil
}

// TestAccessTokenActsAsKey: a federation access token authenticates the
// chat route as the workspace key it targets, shares that organization's
// turn budget, and stops working when the key is disabled.
func TestAccessTokenActsAsKey(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		const tok = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ3b3JrbG9hZCJ9.c2ln"
		var keyID string
		e := newEnv(t, db, func(s *server.Server) {
			s.Auth.Tokens = &lazyTokens{token: tok, keyID: &keyID}
			s.Chat.Limiter = memLimiter(t, 2)
		})
		if err := db.NewSelect().Model((*store.APIKey)(nil)).Column("id").Where("kind = ?", store.KeyWorkspace).Limit(1).Scan(context.Background(), &keyID); err != nil {
			t.Fatal(err)
		}
		e.d.set(okScript, okScript)
		if status, body, _ := e.post(t, tok, e.InternID, userBody("hi")); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
		if status, _, _ := e.chat(t, userBody("hi")); status != 200 {
			t.Fatal(status)
		}
		status, body, _ := e.post(t, tok, e.InternID, userBody("hi"))
		wantRefusal(t, status, body, 429, "rate_limited")
		exec(t, db, "UPDATE api_keys SET disabled_at = ? WHERE id = ?", time.Now().UTC(), keyID)
		status, body, _ = e.post(t, tok, e.InternID, userBody("hi"))
		wantRefusal(t, status, body, 401, "")
	})
}

type lazyTokens struct {
	token string
	keyID *string
}

func (v *lazyTokens) VerifyAccessToken(ctx context.Context, tok string) (string, error) {
	return tokens{v.token, *v.keyID}.VerifyAccessToken(ctx, tok)
}

// otherOrgManagementKey creates an organization with an entitled admin and
// returns its management key.
func otherOrgManagementKey(t *testing.T, e *env) string {
	t.Helper()
	ctx := context.Background()
	acc := e.Server.Accounts
	org, err := acc.CreateOrganization(ctx, auth.Operator(""), &cohortv1.CreateOrganizationRequest{Name: "Other",
		Entitlements: &cohortv1.Entitlements{InternsProgramme: true}})
	if err != nil {
		t.Fatal(err)
	}
	op := auth.Operator(org.GetId())
	u, err := acc.CreateUser(ctx, op, &cohortv1.CreateUserRequest{Email: "admin@" + org.GetId() + ".test", Role: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	op.UserID = u.GetId()
	k, err := acc.CreateAPIKey(ctx, op, &cohortv1.CreateApiKeyRequest{Kind: store.KeyManagement})
	if err != nil {
		t.Fatal(err)
	}
	return k.GetKey()
}

// A refusal the caller may retry says when (Retry-After), whether the
// daemon said so (passed on) or not (the gateway's default for it).
func TestRetryableRefusalsSayWhen(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))
	prompt := userBody("hi")
	cases := []struct {
		name   string
		err    error
		status int
		retry  string
	}{
		{"paused runs at their bound, daemon says 7", apierr.ToConnect(apierr.New(503, "busy", "full").Retry(7)), 503, "7"},
		{"paused runs at their bound, daemon says nothing", refuse(503, "busy"), 503, "5"},
		{"busy session", refuse(409, "busy"), 409, "1"},
		{"paused share as first event", nil, 503, "5"},
	}
	for _, c := range cases {
		sc := events(c.err)
		if c.err == nil {
			sc = events(nil, finishedEv("", &interndv1.Finished{Reason: interndv1.Finished_REASON_ERROR, Code: 503, ErrorReason: "busy", Message: "one caller"}))
		}
		e.d.set(sc, sc)
		status, body, h := e.chat(t, prompt)
		if status != c.status || h.Get("Retry-After") != c.retry {
			t.Errorf("%s: %d Retry-After %q, want %d %q: %s", c.name, status, h.Get("Retry-After"), c.status, c.retry, body)
		}
		e.d.waitEnded(t)
	}
}

// TestPausedSessionRefusal: the daemon's 409 for a session paused on a
// question reaches the caller word for word (it names the tool_call_id
// to answer), in the spec's body shape, reason busy.
func TestPausedSessionRefusal(t *testing.T) {
	db := storetest.SQLite(t)
	e := newEnv(t, db)
	msg := `this session is paused waiting for an answer to interaction "int-7"; answer it with a tool message whose tool_call_id is "int-7"`
	sc := events(apierr.ToConnect(apierr.Conflict("busy", "%s", msg).Retry(apierr.RetryBusySession)))
	e.d.set(sc, sc)
	status, body, _ := e.chat(t, userBody("hi"))
	if eb := wantRefusal(t, status, body, 409, "busy"); eb.Error.Message != msg {
		t.Fatalf("message %q, want the daemon's %q", eb.Error.Message, msg)
	}
	e.d.waitEnded(t)
}
