package accounts_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

func authed[T any](key string, msg *T) *connect.Request[T] {
	r := connect.NewRequest(msg)
	r.Header().Set("Authorization", "Bearer "+key)
	return r
}

// TestDepartureAndGrants follows a user who leaves: their keys still
// authenticate, the principal says they departed, and a grant covers them.
func TestDepartureAndGrants(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		admin := cohortv1connect.NewAdminServiceClient(e.HTTPClient(), e.URL)
		u, err := admin.CreateUser(ctx, authed(e.ManagementKey, &cohortv1.CreateUserRequest{Email: "Bob@Example.test", Name: "Bob"}))
		if err != nil {
			t.Fatal(err)
		}
		if u.Msg.GetUser().GetEmail() != "bob@example.test" || u.Msg.GetUser().GetRole() != "member" {
			t.Fatalf("user %v", u.Msg.GetUser())
		}
		bobID := u.Msg.GetUser().GetId()
		k, err := admin.CreateApiKey(ctx, authed(e.ManagementKey, &cohortv1.CreateApiKeyRequest{Kind: "workspace", WorkspaceId: e.WorkspaceID, UserId: bobID}))
		if err != nil {
			t.Fatal(err)
		}
		key := k.Msg.GetKey()
		if !strings.HasPrefix(key, "cohort_wk_") || k.Msg.GetApiKey().GetPrefix() != key[:14] || k.Msg.GetApiKey().GetCreatedBy() != bobID {
			t.Fatalf("key record %v", k.Msg.GetApiKey())
		}
		p, err := e.Server.Auth.Bearer(ctx, "Bearer "+key)
		if err != nil || p.Departed() || p.WorkspaceID != e.WorkspaceID || p.UserID != bobID || p.KeyKind != "workspace" {
			t.Fatalf("principal before leaving: %+v %v", p, err)
		}
		if _, err := admin.MarkUserLeft(ctx, authed(e.ManagementKey, &cohortv1.MarkUserLeftRequest{UserId: bobID})); err != nil {
			t.Fatal(err)
		}
		p, err = e.Server.Auth.Bearer(ctx, "Bearer "+key)
		if err != nil || !p.CreatorLeft || !p.Departed() {
			t.Fatalf("principal after leaving: %+v %v", p, err)
		}
		// Leaving twice is a 404: there is no current membership to end.
		_, err = admin.MarkUserLeft(ctx, authed(e.ManagementKey, &cohortv1.MarkUserLeftRequest{UserId: bobID}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("second departure: %v", err)
		}
		// A departed user cannot be given new keys.
		_, err = admin.CreateApiKey(ctx, authed(e.ManagementKey, &cohortv1.CreateApiKeyRequest{Kind: "personal", UserId: bobID}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("key for departed user: %v", err)
		}
		// A grant on another workspace does not cover the key; one on its workspace does.
		ws2 := "Other"
		w2, err := e.Server.Workspaces.Create(ctx, e.Operator(), &cohortv1.CreateWorkspaceRequest{Name: &ws2})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CreateGrant(ctx, authed(e.ManagementKey, &cohortv1.CreateGrantRequest{UserId: bobID, WorkspaceId: w2.GetId()})); err != nil {
			t.Fatal(err)
		}
		if p, _ = e.Server.Auth.Bearer(ctx, "Bearer "+key); !p.Departed() {
			t.Fatal("a grant on another workspace covered the key")
		}
		if _, err := admin.CreateGrant(ctx, authed(e.ManagementKey, &cohortv1.CreateGrantRequest{UserId: bobID, WorkspaceId: e.WorkspaceID})); err != nil {
			t.Fatal(err)
		}
		if p, _ = e.Server.Auth.Bearer(ctx, "Bearer "+key); p.Departed() || !p.CreatorHasGrant {
			t.Fatalf("grant on the key's workspace not honoured: %+v", p)
		}
		users, err := admin.ListUsers(ctx, authed(e.ManagementKey, &cohortv1.ListUsersRequest{}))
		if err != nil || len(users.Msg.GetUsers()) != 2 || users.Msg.GetUsers()[1].GetLeftAt() == nil {
			t.Fatalf("users %v %v", users, err)
		}
	})
}

func TestKeyLifecycle(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		admin := cohortv1connect.NewAdminServiceClient(e.HTTPClient(), e.URL)
		k, err := admin.CreateApiKey(ctx, authed(e.ManagementKey, &cohortv1.CreateApiKeyRequest{Kind: "management", Name: "ci"}))
		if err != nil {
			t.Fatal(err)
		}
		id, key := k.Msg.GetApiKey().GetId(), k.Msg.GetKey()
		use := func() error {
			_, err := admin.GetOrganization(ctx, authed(key, &cohortv1.GetOrganizationRequest{}))
			return err
		}
		if err := use(); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.DisableApiKey(ctx, authed(e.ManagementKey, &cohortv1.DisableApiKeyRequest{Id: id})); err != nil {
			t.Fatal(err)
		}
		if err := use(); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("disabled key: %v", err)
		}
		if _, err := admin.EnableApiKey(ctx, authed(e.ManagementKey, &cohortv1.EnableApiKeyRequest{Id: id})); err != nil {
			t.Fatal(err)
		}
		if err := use(); err != nil {
			t.Fatalf("re-enabled key: %v", err)
		}
		if _, err := admin.DeleteApiKey(ctx, authed(e.ManagementKey, &cohortv1.DeleteApiKeyRequest{Id: id})); err != nil {
			t.Fatal(err)
		}
		if err := use(); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("deleted key: %v", err)
		}
		// A deleted key cannot be enabled again and is no longer listed.
		if _, err := admin.EnableApiKey(ctx, authed(e.ManagementKey, &cohortv1.EnableApiKeyRequest{Id: id})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("enable deleted: %v", err)
		}
		l, err := admin.ListApiKeys(ctx, authed(e.ManagementKey, &cohortv1.ListApiKeysRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range l.Msg.GetApiKeys() {
			if k.GetId() == id {
				t.Fatal("deleted key listed")
			}
		}
		// The stored hash is never the key, and no response carries a hash.
		var hash string
		e.DB.NewRaw("SELECT hash FROM api_keys WHERE id = ?", id).Scan(ctx, &hash)
		if hash == "" || strings.Contains(hash, key) || strings.Contains(l.Msg.String(), hash) {
			t.Fatal("key stored or shown in clear")
		}
		// Only management keys may administer.
		_, err = admin.ListApiKeys(ctx, authed(e.WorkspaceKey, &cohortv1.ListApiKeysRequest{}))
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("workspace key administering: %v", err)
		}
	})
}

func TestCreateKeyValidation(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		cases := []struct {
			req  *cohortv1.CreateApiKeyRequest
			want int
		}{
			{&cohortv1.CreateApiKeyRequest{Kind: "root"}, 400},
			{&cohortv1.CreateApiKeyRequest{Kind: "management", WorkspaceId: e.WorkspaceID}, 400},
			{&cohortv1.CreateApiKeyRequest{Kind: "workspace"}, 400},
			{&cohortv1.CreateApiKeyRequest{Kind: "workspace", WorkspaceId: "nope"}, 404},
			{&cohortv1.CreateApiKeyRequest{Kind: "personal", UserId: "nobody"}, 404},
			{&cohortv1.CreateApiKeyRequest{Kind: "personal", Name: strings.Repeat("n", 101)}, 400},
		}
		for _, c := range cases {
			_, err := e.Server.Accounts.CreateAPIKey(ctx, e.Operator(), c.req)
			if got := apierr.From(err); err == nil || got.Status != c.want {
				t.Errorf("%v: got %v, want %d", c.req, err, c.want)
			}
		}
		// A workspace key may not administer.
		p, _ := e.Server.Auth.Bearer(ctx, "Bearer "+e.WorkspaceKey)
		if _, err := e.Server.Accounts.CreateAPIKey(ctx, p, &cohortv1.CreateApiKeyRequest{Kind: "personal"}); apierr.From(err).Status != http.StatusForbidden {
			t.Fatalf("workspace key created a key: %v", err)
		}
		// Only the operator creates organizations.
		mp, _ := e.Server.Auth.Bearer(ctx, "Bearer "+e.ManagementKey)
		if _, err := e.Server.Accounts.CreateOrganization(ctx, mp, &cohortv1.CreateOrganizationRequest{Name: "x"}); apierr.From(err).Status != 403 {
			t.Fatalf("management key created an organization: %v", err)
		}
		if _, err := e.Server.Accounts.CreateOrganization(ctx, auth.Operator(""), &cohortv1.CreateOrganizationRequest{Name: " "}); apierr.From(err).Status != 400 {
			t.Fatalf("blank organization name: %v", err)
		}
	})
}
