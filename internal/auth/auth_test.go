package auth_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// tokens accepts one access token, acting as one key.
type tokens struct{ token, keyID string }

func (v *tokens) VerifyAccessToken(_ context.Context, tok string) (string, error) {
	if tok != v.token {
		return "", apierr.Unauthenticated("invalid access token")
	}
	return v.keyID, nil
}

func keyID(t *testing.T, e *testenv.Env, kind string) string {
	t.Helper()
	var id string
	if err := e.DB.NewSelect().Model((*store.APIKey)(nil)).Column("id").Where("kind = ?", kind).Limit(1).Scan(context.Background(), &id); err != nil {
		t.Fatal(err)
	}
	return id
}

func exec(t *testing.T, e *testenv.Env, q string, args ...any) {
	t.Helper()
	if _, err := e.DB.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatal(err)
	}
}

// Every key kind resolves to its principal; malformed, unknown, disabled
// and deleted credentials are 401 with a message that says which; a
// departed creator is reported (with or without a grant); an access token
// acts as its key, marked as such.
func TestBearer(t *testing.T) {
	t.Parallel()
	const tok = "header.payload.signature"
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		var v tokens
		e.Server.Auth.Tokens = &v
		a, ctx := e.Server.Auth, context.Background()
		personal := e.NewKey(t, store.KeyPersonal, e.WorkspaceID)
		for _, c := range []struct {
			key, kind, workspace string
			management           bool
		}{
			{e.ManagementKey, store.KeyManagement, "", true},
			{e.WorkspaceKey, store.KeyWorkspace, e.WorkspaceID, false},
			{personal, store.KeyPersonal, e.WorkspaceID, false},
		} {
			p, err := a.Bearer(ctx, "Bearer "+c.key)
			if err != nil {
				t.Fatalf("%s: %v", c.kind, err)
			}
			if p.KeyKind != c.kind || p.OrganizationID != e.OrganizationID || p.WorkspaceID != c.workspace ||
				p.IsManagement() != c.management || p.UserID != e.AdminUserID || p.AccessToken || p.Departed() {
				t.Errorf("%s: %+v", c.kind, p)
			}
			if p2, err := a.Bearer(ctx, "bearer   "+c.key+" "); err != nil || p2.KeyID != p.KeyID {
				t.Errorf("%s: the scheme is case-insensitive and spaces around the key do not count: %v", c.kind, err)
			}
		}
		for header, want := range map[string]string{
			"":                               "missing API key",
			"Basic abc":                      "malformed",
			"Bearer ":                        "malformed",
			"Bearer cohort_wk_" + "x":        "invalid API key",
			"Bearer " + e.WorkspaceKey + "x": "invalid API key",
			"Bearer not.a.token":             "invalid access token",
		} {
			_, err := a.Bearer(ctx, header)
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized || !strings.Contains(ae.Message, want) {
				t.Errorf("%q: %v, want 401 %q", header, err, want)
			}
		}

		// Disabled, then enabled again; deleted for good.
		wk := keyID(t, e, store.KeyWorkspace)
		exec(t, e, "UPDATE api_keys SET disabled_at = ? WHERE id = ?", time.Now().UTC(), wk)
		if _, err := a.Bearer(ctx, "Bearer "+e.WorkspaceKey); !apierr.Is(err, 401, "") || !strings.Contains(err.Error(), "disabled") {
			t.Errorf("disabled key: %v", err)
		}
		exec(t, e, "UPDATE api_keys SET disabled_at = NULL WHERE id = ?", wk)
		if _, err := a.Bearer(ctx, "Bearer "+e.WorkspaceKey); err != nil {
			t.Errorf("re-enabled key: %v", err)
		}

		// The creator leaves: the key still authenticates, and says so;
		// a grant covers it again.
		exec(t, e, "UPDATE memberships SET left_at = ? WHERE user_id = ?", time.Now().UTC(), e.AdminUserID)
		p, err := a.Bearer(ctx, "Bearer "+e.WorkspaceKey)
		if err != nil || !p.Departed() {
			t.Errorf("departed creator: %+v %v", p, err)
		}
		exec(t, e, "INSERT INTO grants (id, organization_id, user_id, created_at) VALUES (?, ?, ?, ?)",
			uuid.NewString(), e.OrganizationID, e.AdminUserID, time.Now().UTC())
		if p, err := a.Bearer(ctx, "Bearer "+e.WorkspaceKey); err != nil || p.Departed() || !p.CreatorHasGrant {
			t.Errorf("departed creator with a grant: %+v %v", p, err)
		}
		exec(t, e, "DELETE FROM grants WHERE user_id = ?", e.AdminUserID)
		exec(t, e, "UPDATE memberships SET left_at = NULL WHERE user_id = ?", e.AdminUserID)

		// An access token acts as its key, and follows the key's state.
		v = tokens{token: tok, keyID: wk}
		p, err = a.Bearer(ctx, "Bearer "+tok)
		if err != nil || !p.AccessToken || p.KeyID != wk || p.WorkspaceID != e.WorkspaceID {
			t.Errorf("access token: %+v %v", p, err)
		}
		exec(t, e, "UPDATE api_keys SET disabled_at = ? WHERE id = ?", time.Now().UTC(), wk)
		if _, err := a.Bearer(ctx, "Bearer "+tok); !apierr.Is(err, 401, "") {
			t.Errorf("access token of a disabled key: %v", err)
		}
		exec(t, e, "UPDATE api_keys SET disabled_at = NULL WHERE id = ?", wk)

		exec(t, e, "UPDATE api_keys SET deleted_at = ? WHERE id = ?", time.Now().UTC(), wk)
		if _, err := a.Bearer(ctx, "Bearer "+e.WorkspaceKey); !apierr.Is(err, 401, "") || !strings.Contains(err.Error(), "invalid API key") {
			t.Errorf("deleted key: %v", err)
		}
	})
}

// On the Connect door an access token reaches only the inference
// procedures: every other one refuses it with 403, whatever the key may
// do; the key itself is admitted. (internal/server checks that the chat is
// the only route declared for inference.)
func TestAccessTokensOnlyReachInference(t *testing.T) {
	t.Parallel()
	const tok = "header.payload.signature"
	v := &tokens{token: tok}
	e := testenv.New(t, storetest.SQLite(t), func(s *server.Server) { s.Auth.Tokens = v })
	v.keyID = keyID(t, e, store.KeyManagement)
	ws := cohortv1connect.NewWorkspaceServiceClient(e.HTTPClient(), e.URL)
	list := func(bearer string) error {
		req := connect.NewRequest(&cohortv1.ListWorkspacesRequest{})
		req.Header().Set("Authorization", "Bearer "+bearer)
		_, err := ws.ListWorkspaces(context.Background(), req)
		return err
	}
	if err := list(e.ManagementKey); err != nil {
		t.Fatalf("the key itself: %v", err)
	}
	if got := apierr.FromConnect(list(tok)); got.Status != http.StatusForbidden || !strings.Contains(got.Message, "inference") {
		t.Fatalf("access token on a management procedure: %+v", got)
	}
}
