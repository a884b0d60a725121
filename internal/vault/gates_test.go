package vault_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

func setEntitlements(t *testing.T, e *testenv.Env, programme, vaultWrites bool) {
	t.Helper()
	_, err := e.Server.Accounts.SetEntitlements(context.Background(), auth.Operator(""), e.OrganizationID,
		&cohortv1.Entitlements{InternsProgramme: programme, WorkloadIdentity: true, VaultWrites: vaultWrites})
	if err != nil {
		t.Fatal(err)
	}
}

func TestOutsideProgrammeIsPlainNotFoundOnEveryVaultRoute(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		setEntitlements(t, e, false, true)
		oversized := string(make([]byte, 500000))
		for _, r := range []struct{ method, path, body string }{
			{"PUT", secretPath(e.InternID, "token"), putBody(t, []string{"x.com"}, "v")},
			{"PUT", secretPath(e.InternID, "BAD NAME"), "{"},
			{"GET", secretPath(e.InternID, "token"), ""},
			{"DELETE", secretPath(e.InternID, "token"), ""},
			{"GET", "/vault/interns/" + e.InternID + "/secrets", ""},
			{"GET", "/vault/workspaces/" + e.WorkspaceID + "/secrets/token", ""},
			{"GET", "/vault/secrets", ""},
			{"PUT", "/vault/secrets/token", putBody(t, []string{"x.com"}, "v")},
			{"DELETE", "/vault/secrets/token", ""},
		} {
			st, body, _ := e.Do(t, r.method, r.path, e.WorkspaceKey, "application/json", r.body)
			if st != 404 || body != `{"error":{"code":404,"message":"not found"}}`+"\n" {
				t.Fatalf("%s %s: %d %s", r.method, r.path, st, body)
			}
		}
		// The gate comes before the body is read, but the body's bound
		// before anything (issue 27): past it is 413 for every caller
		// alike, which says nothing about the programme.
		if st, body, _ := e.Do(t, "PUT", secretPath(e.InternID, "token"), e.WorkspaceKey, "application/json", oversized); st != 413 {
			t.Fatalf("oversized: %d %s", st, body)
		}
		if got := counts(t, e); got != "vaults=0 vault_secrets=0 vault_releases=0" {
			t.Fatalf("rows: %s", got)
		}
	})
}

func TestInsideProgrammeOtherRoutes(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		st, body, h := e.Do(t, "GET", secretPath(e.InternID, "token"), e.WorkspaceKey, "", "")
		wantError(t, st, body, 405, "method_not_allowed", "never read back")
		if h.Get("Allow") != "PUT, DELETE" {
			t.Fatalf("Allow: %q", h.Get("Allow"))
		}
		for _, r := range []struct{ method, path, allow string }{
			{"POST", "/vault/interns/" + e.InternID + "/secrets", "GET"},
			{"GET", "/vault/secrets/token", "PUT, DELETE"},
			{"POST", "/vault/secrets", "GET"},
		} {
			st, body, h = e.Do(t, r.method, r.path, e.WorkspaceKey, "", "")
			wantError(t, st, body, 405, "method_not_allowed")
			if h.Get("Allow") != r.allow {
				t.Fatalf("%s %s: Allow %q", r.method, r.path, h.Get("Allow"))
			}
		}
		st, body, _ = e.Do(t, "GET", "/vault/workspaces/"+e.WorkspaceID+"/secrets", e.WorkspaceKey, "", "")
		wantError(t, st, body, 404, "not_found", "no vault route")
		st, body, _ = e.Do(t, "PUT", secretPath(e.InternID, ""), e.WorkspaceKey, "application/json", putBody(t, []string{"x.com"}, "v"))
		wantError(t, st, body, 404, "not_found")
	})
}

func TestAuthenticationAndKeyScope(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		body := putBody(t, []string{"x.com"}, "v")
		path := secretPath(e.InternID, "token")

		st, resp, _ := e.Do(t, "PUT", path, "", "application/json", body)
		wantError(t, st, resp, 401, "")
		st, resp, _ = e.Do(t, "PUT", path, "not-a-key", "application/json", body)
		wantError(t, st, resp, 401, "")

		// A management key selects no workspace: refused, no fallback.
		st, resp, _ = e.Do(t, "PUT", path, e.ManagementKey, "application/json", body)
		wantError(t, st, resp, 403, "forbidden", "management key selects no workspace")
		// A personal key without an active workspace: refused.
		st, resp, _ = e.Do(t, "PUT", path, e.NewKey(t, store.KeyPersonal, ""), "application/json", body)
		wantError(t, st, resp, 403, "forbidden", "no active workspace")

		// A key whose creator left without a grant: refused.
		op := e.Operator()
		u, err := e.Server.Accounts.CreateUser(ctx, op, &cohortv1.CreateUserRequest{Email: "leaver@example.com"})
		if err != nil {
			t.Fatal(err)
		}
		k, err := e.Server.Accounts.CreateAPIKey(ctx, op, &cohortv1.CreateApiKeyRequest{Kind: store.KeyWorkspace, WorkspaceId: e.WorkspaceID, UserId: u.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		mustPut(t, e, k.GetKey(), e.InternID, "before_leaving", []string{"x.com"}, "v", 201)
		if _, err := e.Server.Accounts.MarkUserLeft(ctx, op, &cohortv1.MarkUserLeftRequest{UserId: u.GetId()}); err != nil {
			t.Fatal(err)
		}
		st, resp, _ = e.Do(t, "PUT", path, k.GetKey(), "application/json", body)
		wantError(t, st, resp, 403, "forbidden", "creator has left")
		// A grant lets it act again.
		if _, err := e.Server.Accounts.CreateGrant(ctx, op, &cohortv1.CreateGrantRequest{UserId: u.GetId()}); err != nil {
			t.Fatal(err)
		}
		mustPut(t, e, k.GetKey(), e.InternID, "after_grant", []string{"x.com"}, "v", 201)

		// Vault writes disabled: 503, and the gate comes before the body.
		setEntitlements(t, e, true, false)
		st, resp, _ = e.Do(t, "PUT", path, e.WorkspaceKey, "application/json", body)
		wantError(t, st, resp, 503, "vault_writes_disabled")
		st, resp, _ = e.Do(t, "PUT", path, e.WorkspaceKey, "application/json", "{")
		wantError(t, st, resp, 503, "vault_writes_disabled")
		if got := counts(t, e); got != "vaults=1 vault_secrets=2 vault_releases=0" {
			t.Fatalf("rows: %s", got)
		}
	})
}

// tokens is a federation verifier for one fixed access token.
type tokens struct{ token, keyID string }

func (v tokens) VerifyAccessToken(_ context.Context, token string) (string, error) {
	if token != v.token {
		return "", context.Canceled
	}
	return v.keyID, nil
}

func TestFederationAccessTokenIsRefused(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		const token = "header.payload.signature"
		var verifier tokens
		e := testenv.New(t, db, func(s *server.Server) { s.Auth.Tokens = &verifier })
		p, err := e.Server.Auth.Bearer(context.Background(), "Bearer "+e.WorkspaceKey)
		if err != nil {
			t.Fatal(err)
		}
		verifier = tokens{token: token, keyID: p.KeyID}
		st, resp, _ := e.Do(t, "PUT", secretPath(e.InternID, "token"), token, "application/json", putBody(t, []string{"x.com"}, "v"))
		wantError(t, st, resp, 403, "forbidden", "inference scope")
		if got := counts(t, e); got != "vaults=0 vault_secrets=0 vault_releases=0" {
			t.Fatalf("rows: %s", got)
		}
	})
}

func TestRegionalHostnamesAreRefused(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := testenv.New(t, db, func(s *server.Server) { s.Vault.RegionalHosts = []string{"EU.api.example.com", "us.api.example.com"} })
		send := func(host string) (int, string) {
			req, err := http.NewRequest("PUT", e.URL+secretPath(e.InternID, "token"), strings.NewReader(putBody(t, []string{"x.com"}, "v")))
			if err != nil {
				t.Fatal(err)
			}
			req.Host = host
			req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
			res, err := e.HTTPClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			if err != nil {
				t.Fatal(err)
			}
			return res.StatusCode, string(b)
		}
		for _, h := range []string{"eu.api.example.com", "EU.API.example.com:443", "us.api.example.com.", "us.api.example.com:8080"} {
			st, body := send(h)
			wantError(t, st, body, 403, "regional_host", "regional hostname")
		}
		if got := counts(t, e); got != "vaults=0 vault_secrets=0 vault_releases=0" {
			t.Fatalf("rows: %s", got)
		}
		// The global hostname, and a name that merely ends like a regional one.
		u, _ := url.Parse(e.URL)
		if st, body := send(u.Host); st != 201 {
			t.Fatalf("global host: %d %s", st, body)
		}
		if st, body := send("xeu.api.example.com"); st != 200 {
			t.Fatalf("other host: %d %s", st, body)
		}
	})
}
