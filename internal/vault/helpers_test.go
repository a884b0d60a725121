package vault_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// secretPath is the REST path of a secret, relative to e.URL.
func secretPath(internID, name string) string {
	return "/vault/interns/" + internID + "/secrets/" + name
}

// putBody renders a request body.
func putBody(t testing.TB, hosts []string, value string) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"hosts": hosts, "value": value})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// put stores a secret through the REST door and returns status and body.
func put(t testing.TB, e *testenv.Env, key, internID, name string, hosts []string, value string) (int, string) {
	t.Helper()
	st, body, _ := e.Do(t, "PUT", secretPath(internID, name), key, "application/json", putBody(t, hosts, value))
	return st, body
}

// secretJSON is the response body of a successful PUT.
type secretJSON struct {
	Name        string   `json:"name"`
	Hosts       []string `json:"hosts"`
	Fingerprint *string  `json:"fingerprint"`
	CreatedAt   string   `json:"created_at"`
}

// mustPut stores a secret and requires the given status.
func mustPut(t testing.TB, e *testenv.Env, key, internID, name string, hosts []string, value string, want int) secretJSON {
	t.Helper()
	st, body := put(t, e, key, internID, name, hosts, value)
	if st != want {
		t.Fatalf("PUT %s: status %d, want %d: %s", name, st, want, body)
	}
	var s secretJSON
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("PUT %s: body %s: %v", name, body, err)
	}
	return s
}

// errorBody is the vault's REST error body, with metadata a pointer so
// its absence is visible.
type errorBody struct {
	Error struct {
		Code     int    `json:"code"`
		Message  string `json:"message"`
		Metadata *struct {
			Reason string `json:"reason"`
		} `json:"metadata"`
	} `json:"error"`
}

// wantError checks status, the body's code, reason ("" = no metadata at
// all) and that the message contains every fragment.
func wantError(t testing.TB, st int, body string, status int, reason string, fragments ...string) {
	t.Helper()
	if st != status {
		t.Fatalf("status %d, want %d: %s", st, status, body)
	}
	var eb errorBody
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eb); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	if eb.Error.Code != status {
		t.Fatalf("error.code %d, want %d: %s", eb.Error.Code, status, body)
	}
	if reason == "" {
		if eb.Error.Metadata != nil {
			t.Fatalf("want no metadata: %s", body)
		}
	} else if eb.Error.Metadata == nil || eb.Error.Metadata.Reason != reason {
		t.Fatalf("want reason %q: %s", reason, body)
	}
	if eb.Error.Message == "" {
		t.Fatalf("empty message: %s", body)
	}
	for _, f := range fragments {
		if !strings.Contains(eb.Error.Message, f) {
			t.Fatalf("message %q does not contain %q", eb.Error.Message, f)
		}
	}
}

// counts returns the row counts of the vault tables.
func counts(t testing.TB, e *testenv.Env) string {
	t.Helper()
	var out []string
	for _, table := range []string{"vaults", "vault_secrets", "vault_releases"} {
		n, err := e.DB.NewSelect().TableExpr(table).Count(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s=%d", table, n))
	}
	return strings.Join(out, " ")
}

// secretRow reads a stored secret row.
func secretRow(t testing.TB, e *testenv.Env, internID, name string) store.VaultSecret {
	t.Helper()
	var row store.VaultSecret
	err := e.DB.NewSelect().Model(&row).
		Where("name = ? AND vault_id = (SELECT id FROM vaults WHERE scope_kind = 'intern' AND owner_id = ?)", name, internID).
		Scan(context.Background())
	if err != nil {
		t.Fatalf("secret row %s: %v", name, err)
	}
	return row
}

// vaultRow reads an intern's vault row.
func vaultRow(t testing.TB, e *testenv.Env, internID string) store.Vault {
	t.Helper()
	var v store.Vault
	if err := e.DB.NewSelect().Model(&v).Where("scope_kind = 'intern' AND owner_id = ?", internID).Scan(context.Background()); err != nil {
		t.Fatalf("vault of %s: %v", internID, err)
	}
	return v
}

// newIntern creates another intern in a workspace of the env's organization.
func newIntern(t testing.TB, e *testenv.Env, workspaceID string) string {
	t.Helper()
	in, err := e.Server.Interns.Create(context.Background(), e.Operator(), &cohortv1.CreateInternRequest{WorkspaceId: workspaceID, Name: "another"})
	if err != nil {
		t.Fatal(err)
	}
	return in.GetId()
}

// newWorkspace creates another workspace and a workspace key for it.
func newWorkspace(t testing.TB, e *testenv.Env, slug string) (id, key string) {
	t.Helper()
	name := "ws " + slug
	ws, err := e.Server.Workspaces.Create(context.Background(), e.Operator(), &cohortv1.CreateWorkspaceRequest{Name: &name, Slug: &slug})
	if err != nil {
		t.Fatal(err)
	}
	return ws.GetId(), e.NewKey(t, store.KeyWorkspace, ws.GetId())
}

func hostsN(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("h%d.example.com", i)
	}
	return out
}
