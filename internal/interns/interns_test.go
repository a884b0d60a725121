package interns_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

func authed[T any](key string, msg *T) *connect.Request[T] {
	r := connect.NewRequest(msg)
	r.Header().Set("Authorization", "Bearer "+key)
	return r
}

func TestInternLifecycle(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		c := cohortv1connect.NewInternServiceClient(e.HTTPClient(), e.URL)
		// A workspace key creates in its own workspace; the model defaults to cohort/demo.
		res, err := c.CreateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.CreateInternRequest{Name: "helper"}))
		if err != nil {
			t.Fatal(err)
		}
		in := res.Msg.GetIntern()
		if in.GetWorkspaceId() != e.WorkspaceID || in.GetModel() != "cohort/demo" || in.GetState() != "provisioning" {
			t.Fatalf("created %v", in)
		}
		model := "openai/gpt-5"
		u, err := c.UpdateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.UpdateInternRequest{Id: in.GetId(), Model: &model}))
		if err != nil || u.Msg.GetIntern().GetModel() != model || u.Msg.GetIntern().GetUpdatedAt() == nil || u.Msg.GetIntern().GetName() != "helper" {
			t.Fatalf("update: %v %v", u, err)
		}
		steps := []struct {
			op   func() (*cohortv1.Intern, error)
			want string
		}{
			{func() (*cohortv1.Intern, error) {
				r, err := c.SuspendIntern(ctx, authed(e.WorkspaceKey, &cohortv1.SuspendInternRequest{Id: in.GetId()}))
				return r.Msg.GetIntern(), err
			}, "suspended"},
			{func() (*cohortv1.Intern, error) {
				r, err := c.ResumeIntern(ctx, authed(e.WorkspaceKey, &cohortv1.ResumeInternRequest{Id: in.GetId()}))
				return r.Msg.GetIntern(), err
			}, "provisioning"},
			{func() (*cohortv1.Intern, error) {
				r, err := c.DeleteIntern(ctx, authed(e.WorkspaceKey, &cohortv1.DeleteInternRequest{Id: in.GetId()}))
				return r.Msg.GetIntern(), err
			}, "deleted"},
		}
		for _, s := range steps {
			got, err := s.op()
			if err != nil || got.GetState() != s.want {
				t.Fatalf("want %s: %v %v", s.want, got, err)
			}
		}
		// A deleted intern is not found anywhere.
		_, err = c.GetIntern(ctx, authed(e.WorkspaceKey, &cohortv1.GetInternRequest{Id: in.GetId()}))
		if apierr.FromConnect(err).Reason != "not_found" {
			t.Fatalf("get deleted: %v", err)
		}
		l, err := c.ListInterns(ctx, authed(e.WorkspaceKey, &cohortv1.ListInternsRequest{}))
		if err != nil || len(l.Msg.GetInterns()) != 1 || l.Msg.GetInterns()[0].GetId() != e.InternID {
			t.Fatalf("list: %v %v", l, err)
		}
	})
}

func TestInternScopeAndProgramme(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		c := cohortv1connect.NewInternServiceClient(e.HTTPClient(), e.URL)
		name := "Second"
		w2, err := e.Server.Workspaces.Create(ctx, e.Operator(), &cohortv1.CreateWorkspaceRequest{Name: &name})
		if err != nil {
			t.Fatal(err)
		}
		k2 := e.NewKey(t, "workspace", w2.GetId())
		// Another workspace's key cannot see the demo intern: the same 404 as a missing one.
		_, err = c.GetIntern(ctx, authed(k2, &cohortv1.GetInternRequest{Id: e.InternID}))
		miss := apierr.FromConnect(err)
		_, err = c.GetIntern(ctx, authed(k2, &cohortv1.GetInternRequest{Id: "00000000-0000-0000-0000-000000000000"}))
		other := apierr.FromConnect(err)
		if miss.Status != 404 || miss.Reason != "not_found" || other.Status != 404 || other.Reason != "not_found" {
			t.Fatalf("other workspace %+v vs missing %+v", miss, other)
		}
		// A management key must name the workspace.
		_, err = c.CreateIntern(ctx, authed(e.ManagementKey, &cohortv1.CreateInternRequest{Name: "x"}))
		if apierr.FromConnect(err).Status != 400 {
			t.Fatalf("management key without workspace: %v", err)
		}
		if _, err = c.CreateIntern(ctx, authed(e.ManagementKey, &cohortv1.CreateInternRequest{Name: "x", WorkspaceId: w2.GetId()})); err != nil {
			t.Fatal(err)
		}
		// Bounds: name 100 ok, 101 refused; model 256 ok, 257 refused.
		for _, c2 := range []struct {
			name, model string
			status      int
		}{
			{strings.Repeat("n", 100), "m", 0}, {strings.Repeat("n", 101), "m", 400}, {"", "m", 400},
			{"n", strings.Repeat("m", 256), 0}, {"n", strings.Repeat("m", 257), 400},
		} {
			_, err := c.CreateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.CreateInternRequest{Name: c2.name, Model: c2.model}))
			if (c2.status == 0 && err != nil) || (c2.status != 0 && apierr.FromConnect(err).Status != c2.status) {
				t.Errorf("name %d model %d: %v", len(c2.name), len(c2.model), err)
			}
		}
		// Outside the interns programme every intern route is a plain 404.
		if _, err := e.Server.Accounts.SetEntitlements(ctx, auth.Operator(""), e.OrganizationID, &cohortv1.Entitlements{}); err != nil {
			t.Fatal(err)
		}
		_, err = c.GetIntern(ctx, authed(e.WorkspaceKey, &cohortv1.GetInternRequest{Id: e.InternID}))
		if got := apierr.FromConnect(err); got.Status != http.StatusNotFound || got.Reason != "" {
			t.Fatalf("outside programme: %+v", got)
		}
	})
}

// A key whose creator left the organization (and holds no grant) is
// refused by every intern operation, as by the chat: plain 403.
func TestDepartedCreatorIsRefused(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		c := cohortv1connect.NewInternServiceClient(e.HTTPClient(), e.URL)
		if _, err := c.GetIntern(ctx, authed(e.WorkspaceKey, &cohortv1.GetInternRequest{Id: e.InternID})); err != nil {
			t.Fatalf("before leaving: %v", err)
		}
		if _, err := e.DB.ExecContext(ctx, "UPDATE memberships SET left_at = ? WHERE user_id = ?", time.Now().UTC(), e.AdminUserID); err != nil {
			t.Fatal(err)
		}
		calls := map[string]func() error{
			"GetIntern": func() error {
				_, err := c.GetIntern(ctx, authed(e.WorkspaceKey, &cohortv1.GetInternRequest{Id: e.InternID}))
				return err
			},
			"ListInterns": func() error {
				_, err := c.ListInterns(ctx, authed(e.WorkspaceKey, &cohortv1.ListInternsRequest{}))
				return err
			},
			"CreateIntern": func() error {
				_, err := c.CreateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.CreateInternRequest{Name: "x"}))
				return err
			},
			"SuspendIntern": func() error {
				_, err := c.SuspendIntern(ctx, authed(e.WorkspaceKey, &cohortv1.SuspendInternRequest{Id: e.InternID}))
				return err
			},
		}
		for name, call := range calls {
			got := apierr.FromConnect(call())
			if got.Status != http.StatusForbidden || got.Reason != "" {
				t.Errorf("%s with a departed creator's key: %+v", name, got)
			}
		}
		var n int
		e.DB.NewSelect().Table("interns").ColumnExpr("count(*)").Where("state <> 'deleted'").Scan(ctx, &n)
		if n != 1 {
			t.Errorf("%d interns: a refused call changed something", n)
		}
	})
}

// An intern names its agent from the operator's catalog: the built-in
// agent by default, an allowed name on create and update, and a clear 400
// that changes nothing for a name the catalog does not hold.
func TestInternAgentIsValidatedAgainstTheCatalog(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		c := cohortv1connect.NewInternServiceClient(e.HTTPClient(), e.URL)
		res, err := c.CreateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.CreateInternRequest{Name: "plain"}))
		if err != nil || res.Msg.GetIntern().GetAgent() != "cohort" {
			t.Fatalf("default agent: %v %v", res, err)
		}
		// Without a catalog only the built-in agent is allowed.
		cat := &catalog{}
		_, err = c.CreateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.CreateInternRequest{Name: "x", Agent: "claude"}))
		if ae := apierr.FromConnect(err); ae.Status != http.StatusBadRequest || ae.Reason != "bad_request" || !strings.Contains(ae.Message, `"cohort"`) {
			t.Fatalf("claude without a catalog: %+v", ae)
		}
		e.Server.Interns.Agents = cat
		_, err = c.CreateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.CreateInternRequest{Name: "x", Agent: "claude"}))
		if ae := apierr.FromConnect(err); ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, "one of cohort, not") {
			t.Fatalf("claude with an empty catalog: %+v", ae)
		}
		cat.names.Store(&[]string{"claude", "codex"})
		res, err = c.CreateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.CreateInternRequest{Name: "c", Agent: "claude"}))
		if err != nil || res.Msg.GetIntern().GetAgent() != "claude" {
			t.Fatalf("create claude: %v %v", res, err)
		}
		id := res.Msg.GetIntern().GetId()
		bad := "rm -rf /"
		_, err = c.UpdateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.UpdateInternRequest{Id: id, Agent: &bad}))
		if ae := apierr.FromConnect(err); ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, "claude, codex") {
			t.Fatalf("update to a command: %+v", ae)
		}
		got, err := c.GetIntern(ctx, authed(e.WorkspaceKey, &cohortv1.GetInternRequest{Id: id}))
		if err != nil || got.Msg.GetIntern().GetAgent() != "claude" {
			t.Fatalf("refused update changed the agent: %v %v", got, err)
		}
		codex := "codex"
		u, err := c.UpdateIntern(ctx, authed(e.WorkspaceKey, &cohortv1.UpdateInternRequest{Id: id, Agent: &codex}))
		if err != nil || u.Msg.GetIntern().GetAgent() != "codex" || u.Msg.GetIntern().GetName() != "c" {
			t.Fatalf("update to codex: %v %v", u, err)
		}
	})
}

// catalog allows the names it holds besides the built-in agent; the test
// changes them while the server runs.
type catalog struct{ names atomic.Pointer[[]string] }

func (c *catalog) Check(agent string) error {
	names := []string{"cohort"}
	if p := c.names.Load(); p != nil {
		names = append(names, *p...)
	}
	if slices.Contains(names, agent) {
		return nil
	}
	return errors.New("agent must be one of " + strings.Join(names, ", ") + ", not " + strconv.Quote(agent))
}

// TestAuthenticateSeesWhatLoadSees: the chat door's one query
// (Authenticate) and Load apply the one visibility rule; for every kind of
// key and intern they find the same rows.
func TestAuthenticateSeesWhatLoadSees(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		s := e.Server.Interns
		name := "Second"
		w2, err := e.Server.Workspaces.Create(ctx, e.Operator(), &cohortv1.CreateWorkspaceRequest{Name: &name})
		if err != nil {
			t.Fatal(err)
		}
		s.Agents = anyAgent{} // so a row with an agent is compared too
		custom := "custom"
		other, err := s.Create(ctx, e.Operator(), &cohortv1.CreateInternRequest{Name: "other", WorkspaceId: w2.GetId(), Agent: custom})
		if err != nil {
			t.Fatal(err)
		}
		gone, err := s.Create(ctx, e.Operator(), &cohortv1.CreateInternRequest{Name: "gone", WorkspaceId: e.WorkspaceID})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Delete(ctx, e.Operator(), gone.GetId()); err != nil {
			t.Fatal(err)
		}
		keys := map[string]string{
			"management":            e.ManagementKey,
			"workspace":             e.WorkspaceKey,
			"other workspace":       e.NewKey(t, "workspace", w2.GetId()),
			"personal":              e.NewKey(t, "personal", e.WorkspaceID),
			"personal, other space": e.NewKey(t, "personal", w2.GetId()),
		}
		ids := map[string]string{"demo": e.InternID, "other workspace's": other.GetId(), "deleted": gone.GetId(),
			"missing": "00000000-0000-0000-0000-000000000000"}
		seen := 0
		for kn, key := range keys {
			for in, id := range ids {
				p, pl, err := s.Authenticate(ctx, e.Server.Auth, "Bearer "+key, id)
				if err != nil {
					t.Fatalf("%s key: %v", kn, err)
				}
				joined, jerr := pl.Get(p)
				loaded, lerr := s.Load(ctx, p, id)
				if (jerr == nil) != (lerr == nil) || (lerr != nil && jerr.Error() != lerr.Error()) {
					t.Errorf("%s key, %s intern: Authenticate %v, Load %v", kn, in, jerr, lerr)
					continue
				}
				if lerr == nil {
					seen++
					// The same row, but for the timestamps Authenticate does not read.
					if d := cmp.Diff(loaded, joined, cmpopts.IgnoreFields(store.Intern{}, "CreatedAt", "UpdatedAt")); d != "" {
						t.Errorf("%s key, %s intern: rows differ (-Load +Authenticate):\n%s", kn, in, d)
					}
				}
			}
		}
		// management: demo and the other workspace's; workspace and
		// personal keys: their own workspace's intern.
		if seen != 2+1+1+1+1 {
			t.Errorf("%d interns seen, want 6", seen)
		}
	})
}

// anyAgent allows every agent name.
type anyAgent struct{}

func (anyAgent) Check(string) error { return nil }
