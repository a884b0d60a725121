package vault_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/vault"
)

type listBody struct {
	Data    []secretJSON `json:"data"`
	HasMore bool         `json:"has_more"`
}

func list(t testing.TB, e *testenv.Env, key, path string) listBody {
	t.Helper()
	st, body, _ := e.Do(t, "GET", path, key, "", "")
	if st != 200 {
		t.Fatalf("GET %s: %d %s", path, st, body)
	}
	var l listBody
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		t.Fatalf("list body %s: %v", body, err)
	}
	if strings.Contains(body, "value") || strings.Contains(body, "ciphertext") {
		t.Fatalf("list shows more than metadata: %s", body)
	}
	return l
}

func names(l listBody) string {
	var out []string
	for _, s := range l.Data {
		out = append(out, s.Name)
	}
	return strings.Join(out, ",")
}

func TestListAndDeleteInternSecrets(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		base := "/vault/interns/" + e.InternID + "/secrets"
		if l := list(t, e, e.WorkspaceKey, base); len(l.Data) != 0 || l.HasMore || !strings.Contains(mustGet(t, e, base), `"data":[]`) {
			t.Fatalf("empty vault lists %+v", l)
		}
		for _, n := range []string{"charlie", "alpha", "bravo"} {
			mustPut(t, e, e.WorkspaceKey, e.InternID, n, []string{"api.example.com"}, "value-"+n, 201)
		}
		l := list(t, e, e.WorkspaceKey, base)
		if names(l) != "alpha,bravo,charlie" || l.HasMore || l.Data[0].Fingerprint == nil || l.Data[0].Hosts[0] != "api.example.com" {
			t.Fatalf("list: %+v", l)
		}
		// Pages: limit at the bound and past it, and the cursor.
		l = list(t, e, e.WorkspaceKey, base+"?limit=2")
		if names(l) != "alpha,bravo" || !l.HasMore {
			t.Fatalf("page 1: %+v", l)
		}
		l = list(t, e, e.WorkspaceKey, base+"?limit=2&after=bravo")
		if names(l) != "charlie" || l.HasMore {
			t.Fatalf("page 2: %+v", l)
		}
		list(t, e, e.WorkspaceKey, base+"?limit=1000")
		for _, q := range []string{"?limit=1001", "?limit=0", "?limit=x", "?limit=", "?after=Bad", "?page=2"} {
			st, body, _ := e.Do(t, "GET", base+q, e.WorkspaceKey, "", "")
			wantError(t, st, body, 400, "bad_request")
		}
		// Delete: 204, then 404; the others stay.
		st, body, _ := e.Do(t, "DELETE", secretPath(e.InternID, "bravo"), e.WorkspaceKey, "", "")
		if st != 204 || body != "" {
			t.Fatalf("delete: %d %q", st, body)
		}
		st, body, _ = e.Do(t, "DELETE", secretPath(e.InternID, "bravo"), e.WorkspaceKey, "", "")
		wantError(t, st, body, 404, "not_found", "secret not found")
		st, body, _ = e.Do(t, "DELETE", secretPath(e.InternID, "Bad"), e.WorkspaceKey, "", "")
		wantError(t, st, body, 400, "bad_request")
		if names(list(t, e, e.WorkspaceKey, base)) != "alpha,charlie" {
			t.Fatal("delete removed the wrong secrets")
		}
		// A deleted secret is never released again.
		if _, err := e.Server.Vault.ReleaseSecret(context.Background(), e.InternID, "bravo", "api.example.com"); !apierr.Is(err, 404, "not_found") {
			t.Fatalf("release of a deleted secret: %v", err)
		}
		// Another workspace's key sees the intern as missing.
		_, otherKey := newWorkspace(t, e, "other-ws")
		st, body, _ = e.Do(t, "GET", base, otherKey, "", "")
		wantError(t, st, body, 404, "not_found")
		st, body, _ = e.Do(t, "DELETE", secretPath(e.InternID, "alpha"), otherKey, "", "")
		wantError(t, st, body, 404, "not_found")
	})
}

func mustGet(t testing.TB, e *testenv.Env, path string) string {
	t.Helper()
	_, body, _ := e.Do(t, "GET", path, e.WorkspaceKey, "", "")
	return body
}

func TestWorkspaceVault(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ws := func(name string) string { return "/vault/secrets/" + name }
		st, body, _ := e.Do(t, "PUT", ws("shared"), e.WorkspaceKey, "application/json", putBody(t, []string{"API.Example.com."}, "same-value"))
		if st != 201 {
			t.Fatalf("put: %d %s", st, body)
		}
		var w secretJSON
		json.Unmarshal([]byte(body), &w)
		if w.Hosts[0] != "api.example.com" || w.Fingerprint == nil {
			t.Fatalf("workspace put: %s", body)
		}
		st, _, _ = e.Do(t, "PUT", ws("shared"), e.WorkspaceKey, "application/json", putBody(t, []string{"api.example.com"}, "same-value"))
		if st != 200 {
			t.Fatalf("replace: %d", st)
		}
		// Same value in the intern's vault: another fingerprint (another key).
		in := mustPut(t, e, e.WorkspaceKey, e.InternID, "shared", []string{"api.example.com"}, "same-value", 201)
		if *in.Fingerprint == *w.Fingerprint {
			t.Fatal("workspace and intern vaults share a fingerprint key")
		}
		var scopes []string
		e.DB.NewSelect().Model((*store.Vault)(nil)).Column("scope_kind").Order("scope_kind").Scan(context.Background(), &scopes)
		if strings.Join(scopes, ",") != "intern,workspace" {
			t.Fatalf("vaults: %v", scopes)
		}
		if names(list(t, e, e.WorkspaceKey, "/vault/secrets")) != "shared" {
			t.Fatal("workspace list")
		}
		// Another workspace has its own, empty, vault.
		_, otherKey := newWorkspace(t, e, "other-ws")
		if l := list(t, e, otherKey, "/vault/secrets"); len(l.Data) != 0 {
			t.Fatalf("other workspace sees %+v", l)
		}
		st, body, _ = e.Do(t, "DELETE", ws("shared"), otherKey, "", "")
		wantError(t, st, body, 404, "not_found")
		// Bad input changes nothing.
		before := counts(t, e)
		for _, b := range []string{putBody(t, []string{"x.com:443"}, "v"), putBody(t, nil, "v"), `{"hosts":["x.com"]}`, `{"hosts":["x.com"],"value":"v","x":1}`} {
			st, body, _ = e.Do(t, "PUT", ws("other"), e.WorkspaceKey, "application/json", b)
			wantError(t, st, body, 400, "bad_request")
		}
		st, body, _ = e.Do(t, "PUT", ws("Bad_"), e.WorkspaceKey, "application/json", putBody(t, []string{"x.com"}, "v"))
		wantError(t, st, body, 400, "bad_request")
		if counts(t, e) != before {
			t.Fatal("bad input changed the database")
		}
		st, _, _ = e.Do(t, "DELETE", ws("shared"), e.WorkspaceKey, "", "")
		if st != 204 {
			t.Fatalf("delete: %d", st)
		}
	})
}

func TestWritesSwitchAppliesToPutAndDeleteNotToLists(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		mustPut(t, e, e.WorkspaceKey, e.InternID, "kept", []string{"api.example.com"}, "v", 201)
		setEntitlements(t, e, true, false)
		for _, r := range []struct{ method, path, body string }{
			{"DELETE", secretPath(e.InternID, "kept"), ""},
			{"PUT", "/vault/secrets/x", putBody(t, []string{"x.com"}, "v")},
			{"DELETE", "/vault/secrets/x", ""},
		} {
			st, body, _ := e.Do(t, r.method, r.path, e.WorkspaceKey, "application/json", r.body)
			wantError(t, st, body, 503, "vault_writes_disabled")
		}
		if names(list(t, e, e.WorkspaceKey, "/vault/interns/"+e.InternID+"/secrets")) != "kept" {
			t.Fatal("list under disabled writes")
		}
		list(t, e, e.WorkspaceKey, "/vault/secrets")
		// The management key is refused on every vault route, lists included.
		st, body, _ := e.Do(t, "GET", "/vault/secrets", e.ManagementKey, "", "")
		wantError(t, st, body, 403, "forbidden")
	})
}

func TestReleaseFallsBackToTheWorkspaceVault(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		v := e.Server.Vault
		st, body, _ := e.Do(t, "PUT", "/vault/secrets/shared", e.WorkspaceKey, "application/json", putBody(t, []string{"ws.example.com"}, "from-workspace"))
		if st != 201 {
			t.Fatal(st, body)
		}
		got, err := v.Release(ctx, vault.ReleaseRequest{InternID: e.InternID, Name: "shared", Host: "ws.example.com", RunID: "run-1", Actor: "daemon:" + e.InternID})
		if err != nil || got != "from-workspace" {
			t.Fatalf("workspace release: %q %v", got, err)
		}
		// The intern's own secret of the same name shadows the workspace's,
		// with its own hosts.
		mustPut(t, e, e.WorkspaceKey, e.InternID, "shared", []string{"own.example.com"}, "from-intern", 201)
		if _, err := v.ReleaseSecret(ctx, e.InternID, "shared", "ws.example.com"); !apierr.Is(err, 403, "host_not_allowed") {
			t.Fatalf("shadowed: %v", err)
		}
		if got, _ := v.ReleaseSecret(ctx, e.InternID, "shared", "own.example.com"); got != "from-intern" {
			t.Fatalf("own: %q", got)
		}
		// An intern of another workspace does not see it.
		wsID, _ := newWorkspace(t, e, "other-ws")
		other := newIntern(t, e, wsID)
		if _, err := v.ReleaseSecret(ctx, other, "shared", "ws.example.com"); !apierr.Is(err, 404, "not_found") {
			t.Fatalf("other workspace's intern: %v", err)
		}
		var rows []store.VaultRelease
		e.DB.NewSelect().Model(&rows).Order("created_at").Scan(ctx)
		if len(rows) != 4 || rows[0].VaultScope != "workspace" || rows[0].RunID == nil || *rows[0].RunID != "run-1" ||
			rows[0].Actor != "daemon:"+e.InternID || rows[2].VaultScope != "intern" || rows[1].Reason != vault.ReasonHostNotAllowed {
			t.Fatalf("audit: %+v", rows)
		}
	})
}

func TestAuditListForAdmins(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		mustPut(t, e, e.WorkspaceKey, e.InternID, "api_key", []string{"api.example.com"}, "canary-audit-value", 201)
		for _, h := range []string{"api.example.com", "evil.test", "api.example.com"} {
			e.Server.Vault.Release(ctx, vault.ReleaseRequest{InternID: e.InternID, Name: "api_key", Host: h, RunID: "r1"})
		}
		c := cohortv1connect.NewVaultAdminServiceClient(e.HTTPClient(), e.URL)
		call := func(key string, req *cohortv1.ListSecretReleasesRequest) (*cohortv1.ListSecretReleasesResponse, error) {
			r := connect.NewRequest(req)
			r.Header().Set("Authorization", "Bearer "+key)
			res, err := c.ListSecretReleases(ctx, r)
			if err != nil {
				return nil, err
			}
			return res.Msg, nil
		}
		res, err := call(e.ManagementKey, &cohortv1.ListSecretReleasesRequest{Limit: 2})
		if err != nil || len(res.Releases) != 2 || !res.HasMore || res.Releases[0].Outcome != "released" || res.Releases[1].Reason != "host_not_allowed" {
			t.Fatalf("page 1: %v %v", res, err)
		}
		res2, err := call(e.ManagementKey, &cohortv1.ListSecretReleasesRequest{Limit: 2, Before: res.Releases[1].Id})
		if err != nil || len(res2.Releases) != 1 || res2.HasMore || res2.Releases[0].GetRunId() != "r1" {
			t.Fatalf("page 2: %v %v", res2, err)
		}
		if _, err := call(e.ManagementKey, &cohortv1.ListSecretReleasesRequest{Limit: 1001}); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("limit past the bound: %v", err)
		}
		if _, err := call(e.ManagementKey, &cohortv1.ListSecretReleasesRequest{Limit: 1000}); err != nil {
			t.Fatalf("limit at the bound: %v", err)
		}
		if _, err := call(e.WorkspaceKey, &cohortv1.ListSecretReleasesRequest{}); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("workspace key: %v", err)
		}
		if strings.Contains(res.String()+res2.String(), "canary-audit-value") {
			t.Fatal("audit shows the value")
		}
		// Outside the interns programme the audit is a vault read like any other: 404.
		setEntitlements(t, e, false, true)
		if _, err := call(e.ManagementKey, &cohortv1.ListSecretReleasesRequest{}); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("outside the programme: %v", err)
		}
	})
}

func authed[T any](key string, msg *T) *connect.Request[T] {
	r := connect.NewRequest(msg)
	r.Header().Set("Authorization", "Bearer "+key)
	return r
}

// TestConnectTwinsOfListDeleteAndWorkspace: the Connect door gives what the
// REST door gives, with the same refusals.
func TestConnectTwinsOfListDeleteAndWorkspace(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		c := vaultClient(e)
		ws, err := c.PutWorkspaceSecret(ctx, authed(e.WorkspaceKey, &cohortv1.PutWorkspaceSecretRequest{Name: "shared", Hosts: []string{"a.example.com"}, Value: "connect-ws-value"}))
		if err != nil || !ws.Msg.GetCreated() || ws.Msg.GetSecret().GetHosts()[0] != "a.example.com" {
			t.Fatalf("put workspace: %v %v", ws, err)
		}
		mustPut(t, e, e.WorkspaceKey, e.InternID, "own", []string{"b.example.com"}, "v", 201)
		li, err := c.ListInternSecrets(ctx, authed(e.WorkspaceKey, &cohortv1.ListInternSecretsRequest{InternId: e.InternID}))
		if err != nil || len(li.Msg.GetSecrets()) != 1 || li.Msg.GetSecrets()[0].GetName() != "own" {
			t.Fatalf("list intern: %v %v", li, err)
		}
		lw, err := c.ListWorkspaceSecrets(ctx, authed(e.WorkspaceKey, &cohortv1.ListWorkspaceSecretsRequest{Limit: 1000}))
		if err != nil || len(lw.Msg.GetSecrets()) != 1 || lw.Msg.GetSecrets()[0].GetName() != "shared" {
			t.Fatalf("list workspace: %v %v", lw, err)
		}
		_, err = c.ListWorkspaceSecrets(ctx, authed(e.WorkspaceKey, &cohortv1.ListWorkspaceSecretsRequest{Limit: 1001}))
		wantConnectError(t, err, connect.CodeInvalidArgument, 400, "bad_request")
		_, err = c.DeleteInternSecret(ctx, authed(e.WorkspaceKey, &cohortv1.DeleteInternSecretRequest{InternId: e.InternID, Name: "missing"}))
		wantConnectError(t, err, connect.CodeNotFound, 404, "not_found")
		_, err = c.ListInternSecrets(ctx, authed(e.ManagementKey, &cohortv1.ListInternSecretsRequest{InternId: e.InternID}))
		wantConnectError(t, err, connect.CodePermissionDenied, 403, "forbidden")
		if _, err := c.DeleteInternSecret(ctx, authed(e.WorkspaceKey, &cohortv1.DeleteInternSecretRequest{InternId: e.InternID, Name: "own"})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.DeleteWorkspaceSecret(ctx, authed(e.WorkspaceKey, &cohortv1.DeleteWorkspaceSecretRequest{Name: "shared"})); err != nil {
			t.Fatal(err)
		}
		if got := counts(t, e); got != "vaults=2 vault_secrets=0 vault_releases=0" {
			t.Fatalf("after deletes: %s", got)
		}
		if strings.Contains(e.Logs(), "connect-ws-value") {
			t.Fatal("a value reached the log")
		}
	})
}

// TestNewRoutesRefuseRegionalHostnames: lists, deletes and workspace
// routes have the PUT's regional-hostname gate.
func TestNewRoutesRefuseRegionalHostnames(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := testenv.New(t, db, func(s *server.Server) { s.Vault.RegionalHosts = []string{"eu.api.example.com"} })
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/vault/interns/" + e.InternID + "/secrets", ""},
			{"DELETE", secretPath(e.InternID, "token"), ""},
			{"GET", "/vault/secrets", ""},
			{"PUT", "/vault/secrets/token", putBody(t, []string{"x.com"}, "v")},
			{"DELETE", "/vault/secrets/token", ""},
		} {
			req, _ := http.NewRequest(r.method, e.URL+r.path, strings.NewReader(r.body))
			req.Host = "EU.api.example.com:443"
			req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
			res, err := e.HTTPClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			wantError(t, res.StatusCode, string(b), 403, "regional_host")
		}
		if got := counts(t, e); got != "vaults=0 vault_secrets=0 vault_releases=0" {
			t.Fatalf("rows: %s", got)
		}
	})
}
