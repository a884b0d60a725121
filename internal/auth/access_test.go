package auth_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/accounts"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/bootstrap"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// credentials are one organization's bearer credentials of every kind and
// state, made through the real accounts service.
type credentials struct {
	tokens *tokens
	// header by name; "" sends no Authorization header.
	header map[string]string
}

// Names of the credentials in the table.
const (
	none, malformed, unknown                 = "none", "malformed", "unknown key"
	management, workspace, personal, noSpace = "management key", "workspace key", "personal key", "personal key, no workspace"
	disabled, deleted                        = "disabled key", "deleted key"
	departed, departedGrant                  = "departed creator", "departed creator with a grant"
	token, tokenDisabled, tokenBad           = "access token", "access token of a disabled key", "invalid access token"
)

func newCredentials(t *testing.T, db *bun.DB) *credentials {
	t.Helper()
	ctx := context.Background()
	res, err := bootstrap.Run(ctx, db)
	if err != nil || res == nil {
		t.Fatalf("bootstrap: %v", err)
	}
	acc := &accounts.Service{DB: db}
	op := auth.Operator(res.OrganizationID)
	users, err := acc.ListUsers(ctx, op)
	if err != nil || len(users) == 0 {
		t.Fatalf("users: %v", err)
	}
	op.UserID = users[0].GetId()
	key := func(kind, ws, user string) *cohortv1.CreateApiKeyResponse {
		t.Helper()
		k, err := acc.CreateAPIKey(ctx, op, &cohortv1.CreateApiKeyRequest{Kind: kind, WorkspaceId: ws, UserId: user})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	user := func(email string) string {
		t.Helper()
		u, err := acc.CreateUser(ctx, op, &cohortv1.CreateUserRequest{Email: email})
		if err != nil {
			t.Fatal(err)
		}
		return u.GetId()
	}
	c := &credentials{tokens: &tokens{}, header: map[string]string{
		none: "", malformed: "Basic abc", unknown: "Bearer cohort_wk_" + strings.Repeat("A", 43),
		management: "Bearer " + res.ManagementKey, workspace: "Bearer " + res.WorkspaceKey,
		tokenBad: "Bearer not.an.access-token",
	}}
	c.header[personal] = "Bearer " + key(store.KeyPersonal, res.WorkspaceID, "").GetKey()
	c.header[noSpace] = "Bearer " + key(store.KeyPersonal, "", "").GetKey()
	off := key(store.KeyWorkspace, res.WorkspaceID, "")
	c.header[disabled] = "Bearer " + off.GetKey()
	if _, err := acc.DisableAPIKey(ctx, op, off.GetApiKey().GetId()); err != nil {
		t.Fatal(err)
	}
	gone := key(store.KeyWorkspace, res.WorkspaceID, "")
	c.header[deleted] = "Bearer " + gone.GetKey()
	if _, err := acc.DeleteAPIKey(ctx, op, gone.GetApiKey().GetId()); err != nil {
		t.Fatal(err)
	}
	leaver, stayer := user("leaver@example.com"), user("stayer@example.com")
	c.header[departed] = "Bearer " + key(store.KeyWorkspace, res.WorkspaceID, leaver).GetKey()
	c.header[departedGrant] = "Bearer " + key(store.KeyWorkspace, res.WorkspaceID, stayer).GetKey()
	for _, u := range []string{leaver, stayer} {
		if _, err := acc.MarkUserLeft(ctx, op, &cohortv1.MarkUserLeftRequest{UserId: u}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := acc.CreateGrant(ctx, op, &cohortv1.CreateGrantRequest{UserId: stayer}); err != nil {
		t.Fatal(err)
	}
	// Access tokens act as a workspace key (the verifier stands in for
	// the federation's signature check).
	c.tokens.keyID = key(store.KeyWorkspace, res.WorkspaceID, "").GetApiKey().GetId()
	c.tokens.token = "header.payload.signature"
	c.header[token] = "Bearer " + c.tokens.token
	return c
}

// want is the answer to one credential on a route of each scope: the
// status, and for an admitted one the kind of key the handler sees.
type want struct{ public, api, inference int }

// The table: every credential kind and state × every route scope. Each
// non-public route runs a caller check that refuses a departed creator
// (as the chat and the vault do); public routes take no credential.
var table = map[string]want{
	none:          {200, 401, 401},
	malformed:     {200, 401, 401},
	unknown:       {200, 401, 401},
	management:    {200, 200, 200},
	workspace:     {200, 200, 200},
	personal:      {200, 200, 200},
	noSpace:       {200, 200, 200},
	disabled:      {200, 401, 401},
	deleted:       {200, 401, 401},
	departed:      {200, 403, 403},
	departedGrant: {200, 200, 200},
	token:         {200, 403, 200},
	tokenDisabled: {200, 401, 401},
	tokenBad:      {200, 401, 401},
}

// admitCounter is a route's caller check that counts its runs and refuses
// a departed creator.
type admitCounter struct {
	runs  int
	hosts []string
}

func (c *admitCounter) admit(ctx context.Context, p *auth.Principal) error {
	c.runs++
	c.hosts = append(c.hosts, auth.Host(ctx))
	if auth.From(ctx) != p {
		return fmt.Errorf("the principal is not in Admit's context")
	}
	if p.Departed() {
		return apierr.Forbidden("the key's creator has left")
	}
	return nil
}

var scopes = []auth.Scope{auth.Public, auth.API, auth.Inference}

func (w want) status(s auth.Scope) int {
	return map[auth.Scope]int{auth.Public: w.public, auth.API: w.api, auth.Inference: w.inference}[s]
}

// TestRESTAccess runs the table through the REST middleware: the status,
// that Admit ran exactly once for a request that reached it (never after a
// 401 or a scope refusal), and that the handler finds the principal.
func TestRESTAccess(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		c := newCredentials(t, db)
		a := &auth.Authenticator{DB: db, Tokens: c.tokens}
		disableTokenKey := disabler(t, db, c)
		for name, w := range table {
			for _, scope := range scopes {
				t.Run(name+"/"+scope.String(), func(t *testing.T) {
					if name == tokenDisabled {
						defer disableTokenKey()()
					}
					var ac admitCounter
					acc := auth.Access{Scope: scope}
					if scope != auth.Public {
						acc.Admit = ac.admit
					}
					var seen *auth.Principal
					h := a.Handler(acc, func(w http.ResponseWriter, r *http.Request, err error) {
						http.Error(w, err.Error(), apierr.From(err).Status)
					}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = auth.From(r.Context()) }))
					req := httptest.NewRequest(http.MethodPost, "http://api.example.com/x", nil)
					if hd := c.header[name]; hd != "" {
						req.Header.Set("Authorization", hd)
					}
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != w.status(scope) {
						t.Fatalf("status %d, want %d: %s", rec.Code, w.status(scope), rec.Body)
					}
					checkAdmitted(t, name, scope, rec.Code, &ac, seen)
					if ac.runs == 1 && ac.hosts[0] != "api.example.com" {
						t.Errorf("Admit saw host %q", ac.hosts[0])
					}
				})
			}
		}
	})
}

// TestConnectAccess runs the table through the Connect interceptor, on a
// real service mounted as internal/server mounts them.
func TestConnectAccess(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		c := newCredentials(t, db)
		a := &auth.Authenticator{DB: db, Tokens: c.tokens}
		disableTokenKey := disabler(t, db, c)
		for _, scope := range scopes {
			var ac admitCounter
			acc := auth.Access{Scope: scope}
			if scope != auth.Public {
				acc.Admit = ac.admit
			}
			svc := &workspaceStub{}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			path, h := cohortv1connect.NewWorkspaceServiceHandler(svc, connect.WithInterceptors(apierr.ConnectInterceptor(log),
				a.Interceptor(map[string]auth.Access{cohortv1connect.WorkspaceServiceListWorkspacesProcedure: acc})))
			mux := http.NewServeMux()
			mux.Handle(path, auth.WithHost(h))
			hs := httptest.NewServer(mux)
			t.Cleanup(hs.Close)
			client := cohortv1connect.NewWorkspaceServiceClient(hs.Client(), hs.URL)
			for name, w := range table {
				t.Run(name+"/"+scope.String(), func(t *testing.T) {
					if name == tokenDisabled {
						defer disableTokenKey()()
					}
					ac.runs, ac.hosts, svc.seen = 0, nil, nil
					req := connect.NewRequest(&cohortv1.ListWorkspacesRequest{})
					if hd := c.header[name]; hd != "" {
						req.Header().Set("Authorization", hd)
					}
					status := 200
					if _, err := client.ListWorkspaces(context.Background(), req); err != nil {
						status = apierr.FromConnect(err).Status
					}
					if status != w.status(scope) {
						t.Fatalf("status %d, want %d", status, w.status(scope))
					}
					checkAdmitted(t, name, scope, status, &ac, svc.seen)
					if ac.runs == 1 && !strings.HasPrefix(ac.hosts[0], "127.0.0.1:") {
						t.Errorf("Admit saw host %q", ac.hosts[0])
					}
				})
			}
			// A procedure nobody declared is refused, never served.
			_, err := client.GetWorkspace(context.Background(), connect.NewRequest(&cohortv1.GetWorkspaceRequest{}))
			if got := apierr.FromConnect(err); got.Status != http.StatusInternalServerError || svc.got {
				t.Errorf("undeclared procedure: %+v", got)
			}
		}
	})
}

// checkAdmitted checks what the handler and Admit saw of one request.
func checkAdmitted(t *testing.T, name string, scope auth.Scope, status int, ac *admitCounter, seen *auth.Principal) {
	t.Helper()
	reachedAdmit := scope != auth.Public && (status == 200 || name == departed)
	if want := map[bool]int{true: 1, false: 0}[reachedAdmit]; ac.runs != want {
		t.Errorf("Admit ran %d times, want %d", ac.runs, want)
	}
	switch {
	case scope == auth.Public:
		if seen != nil {
			t.Errorf("a public route got a principal: %+v", seen)
		}
	case status == 200:
		if seen == nil {
			t.Fatal("the handler got no principal")
		}
		if seen.AccessToken != (name == token) {
			t.Errorf("AccessToken %v", seen.AccessToken)
		}
		kind := map[string]string{management: store.KeyManagement, personal: store.KeyPersonal, noSpace: store.KeyPersonal}[name]
		if kind == "" {
			kind = store.KeyWorkspace
		}
		if seen.KeyKind != kind {
			t.Errorf("key kind %q, want %q", seen.KeyKind, kind)
		}
	case seen != nil:
		t.Error("a refused request reached the handler")
	}
}

// disabler returns a function that disables the access token's key for
// one case and returns the function that enables it again.
func disabler(t *testing.T, db *bun.DB, c *credentials) func() func() {
	c.header[tokenDisabled] = c.header[token]
	return func() func() {
		exec := func(q string) {
			if _, err := db.ExecContext(context.Background(), q, c.tokens.keyID); err != nil {
				t.Fatal(err)
			}
		}
		exec("UPDATE api_keys SET disabled_at = CURRENT_TIMESTAMP WHERE id = ?")
		return func() { exec("UPDATE api_keys SET disabled_at = NULL WHERE id = ?") }
	}
}

type workspaceStub struct {
	cohortv1connect.UnimplementedWorkspaceServiceHandler
	seen *auth.Principal
	got  bool
}

func (s *workspaceStub) ListWorkspaces(ctx context.Context, _ *connect.Request[cohortv1.ListWorkspacesRequest]) (*connect.Response[cohortv1.ListWorkspacesResponse], error) {
	s.seen = auth.From(ctx)
	return connect.NewResponse(&cohortv1.ListWorkspacesResponse{}), nil
}

func (s *workspaceStub) GetWorkspace(context.Context, *connect.Request[cohortv1.GetWorkspaceRequest]) (*connect.Response[cohortv1.GetWorkspaceResponse], error) {
	s.got = true
	return nil, nil
}

// A declaration that cannot be enforced is reported.
func TestAccessCheck(t *testing.T) {
	t.Parallel()
	admit := func(context.Context, *auth.Principal) error { return nil }
	for _, c := range []struct {
		acc auth.Access
		ok  bool
	}{
		{auth.Access{}, false},
		{auth.Access{Scope: 9}, false},
		{auth.Access{Scope: auth.Public}, true},
		{auth.Access{Scope: auth.Public, Admit: admit}, false},
		{auth.Access{Scope: auth.API}, true},
		{auth.Access{Scope: auth.Inference, Admit: admit}, true},
	} {
		if err := c.acc.Check(); (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.acc, err)
		}
	}
}
