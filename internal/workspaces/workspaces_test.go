package workspaces_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

const jsonCT = "application/json"

func count(t *testing.T, e *testenv.Env) int64 {
	t.Helper()
	n, err := e.DB.NewSelect().Model((*store.Workspace)(nil)).Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type errBody struct {
	Error struct {
		Code     int             `json:"code"`
		Message  string          `json:"message"`
		Metadata json.RawMessage `json:"metadata"`
	} `json:"error"`
}

// wantError checks the spec's workspace error body exactly: code equal to
// the status, a message, and nothing else.
func wantError(t *testing.T, status int, body string, wantStatus int, msgContains string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status %d, want %d; body %s", status, wantStatus, body)
	}
	var raw map[string]map[string]any
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatalf("body is not JSON: %s", body)
	}
	if len(raw) != 1 || len(raw["error"]) != 2 {
		t.Fatalf("body must be exactly {error:{code,message}}: %s", body)
	}
	var b errBody
	json.Unmarshal([]byte(body), &b)
	if b.Error.Code != wantStatus || b.Error.Message == "" {
		t.Fatalf("error body %s", body)
	}
	if msgContains != "" && !strings.Contains(b.Error.Message, msgContains) {
		t.Fatalf("message %q does not mention %q", b.Error.Message, msgContains)
	}
}

func TestCreateWorkspaceSuccess(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		before := time.Now().UTC().Add(-time.Second)
		keyID := mustKeyID(t, e)
		body := fmt.Sprintf(`{"name":"Research Team","slug":"research","description":"d","default_text_model":"openai/gpt-5",
			"default_image_model":"img/x","default_provider_sort":"latency","io_logging_api_key_ids":[%q],
			"io_logging_sampling_rate":0.5,"is_data_discount_logging_enabled":true,"is_observability_broadcast_enabled":true,
			"is_observability_io_logging_enabled":true}`, keyID)
		status, resp, hdr := e.Do(t, "POST", "/workspaces", e.ManagementKey, jsonCT, body)
		if status != http.StatusCreated {
			t.Fatalf("status %d: %s", status, resp)
		}
		if ct := hdr.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("content type %q", ct)
		}
		var raw map[string]map[string]any
		if err := json.Unmarshal([]byte(resp), &raw); err != nil {
			t.Fatal(err)
		}
		w := raw["data"]
		fields := []string{"id", "name", "slug", "description", "default_text_model", "default_image_model", "default_provider_sort",
			"default_guardrail_id", "io_logging_api_key_ids", "io_logging_sampling_rate", "is_data_discount_logging_enabled",
			"is_observability_broadcast_enabled", "is_observability_io_logging_enabled", "created_at", "created_by", "updated_at"}
		if len(w) != len(fields) {
			t.Fatalf("workspace has %d fields, want %d: %v", len(w), len(fields), w)
		}
		for _, f := range fields {
			if _, ok := w[f]; !ok {
				t.Errorf("missing field %q", f)
			}
		}
		want := map[string]any{"name": "Research Team", "slug": "research", "description": "d", "default_text_model": "openai/gpt-5",
			"default_image_model": "img/x", "default_provider_sort": "latency", "io_logging_sampling_rate": 0.5,
			"is_data_discount_logging_enabled": true, "is_observability_broadcast_enabled": true, "is_observability_io_logging_enabled": true,
			"created_by": e.AdminUserID, "updated_at": nil, "default_guardrail_id": nil}
		for k, v := range want {
			if w[k] != v {
				t.Errorf("%s = %v, want %v", k, w[k], v)
			}
		}
		if ids, _ := w["io_logging_api_key_ids"].([]any); len(ids) != 1 || ids[0] != keyID {
			t.Errorf("io_logging_api_key_ids = %v", w["io_logging_api_key_ids"])
		}
		created, err := time.Parse(time.RFC3339Nano, w["created_at"].(string))
		if err != nil || created.Before(before) || created.After(time.Now().Add(time.Second)) {
			t.Errorf("created_at %v", w["created_at"])
		}
		// What the create returned is what a read returns.
		got, err := e.Server.Workspaces.Get(context.Background(), e.Operator(), w["id"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if !got.GetCreatedAt().AsTime().Equal(created) || got.GetSlug() != "research" {
			t.Fatalf("read back %v", got)
		}
	})
}

func mustKeyID(t *testing.T, e *testenv.Env) string {
	t.Helper()
	ks, err := e.Server.Accounts.ListAPIKeys(context.Background(), e.Operator(), &cohortv1.ListApiKeysRequest{})
	if err != nil || len(ks) == 0 {
		t.Fatal(err)
	}
	return ks[0].GetId()
}

func TestCreateWorkspaceDefaults(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		status, resp, _ := e.Do(t, "POST", "/workspaces", e.ManagementKey, jsonCT, `{"name":"  Ünïcode -- Team!! 2 "}`)
		if status != http.StatusCreated {
			t.Fatalf("status %d: %s", status, resp)
		}
		var r struct{ Data map[string]any }
		json.Unmarshal([]byte(resp), &r)
		want := map[string]any{"slug": "n-code-team-2", "description": "", "default_text_model": "", "default_image_model": "",
			"default_provider_sort": "price", "io_logging_api_key_ids": nil, "io_logging_sampling_rate": 1.0,
			"is_data_discount_logging_enabled": false, "is_observability_broadcast_enabled": false, "is_observability_io_logging_enabled": false}
		for k, v := range want {
			if r.Data[k] != v {
				t.Errorf("%s = %#v, want %#v", k, r.Data[k], v)
			}
		}
		// A derived slug that is taken gets a suffix; an explicit one is a 409.
		_, resp2, _ := e.Do(t, "POST", "/workspaces", e.ManagementKey, jsonCT, `{"name":"Default"}`)
		if !strings.Contains(resp2, `"slug":"default-2"`) {
			t.Fatalf("derived slug collision: %s", resp2)
		}
		n := count(t, e)
		status, resp, _ = e.Do(t, "POST", "/workspaces", e.ManagementKey, jsonCT, `{"name":"x","slug":"default"}`)
		wantError(t, status, resp, http.StatusConflict, `"default"`)
		if count(t, e) != n {
			t.Fatal("a refused create changed the database")
		}
		// An explicit empty array is kept as [] (not null).
		_, resp, _ = e.Do(t, "POST", "/workspaces", e.ManagementKey, jsonCT, `{"name":"y","io_logging_api_key_ids":[]}`)
		if !strings.Contains(resp, `"io_logging_api_key_ids":[]`) {
			t.Fatalf("empty id list: %s", resp)
		}
	})
}

func TestCreateWorkspaceBadInput(t *testing.T) {
	t.Parallel()
	s := func(n int, c string) string { return strings.Repeat(c, n) }
	cases := []struct {
		name, body string
		status     int
		mention    string
	}{
		{"malformed json", `{"name":`, 400, "malformed JSON"},
		{"not an object", `["name"]`, 400, "JSON object"},
		{"empty body", ``, 400, "empty"},
		{"trailing data", `{"name":"a"} {}`, 400, "after the object"},
		{"unknown field", `{"name":"a","colour":"red"}`, 400, `"colour"`},
		{"case variant field", `{"Name":"a"}`, 400, `"Name"`},
		{"duplicate field", `{"name":"a","name":"b"}`, 400, `"name"`},
		{"name missing", `{}`, 400, "name"},
		{"name null", `{"name":null}`, 400, "name"},
		{"name wrong type", `{"name":5}`, 400, `"name"`},
		{"name empty", `{"name":""}`, 400, "name"},
		{"name blank", `{"name":"   "}`, 400, "name"},
		{"name 101", `{"name":"` + s(101, "a") + `"}`, 400, "100"},
		{"name 101 multibyte", `{"name":"` + s(101, "é") + `"}`, 400, "100"},
		{"name control char", `{"name":"a\u0000b"}`, 400, "control"},
		{"name lone surrogate", `{"name":"team \ud800"}`, 400, "name is not valid UTF-8"},
		{"name invalid bytes", "{\"name\":\"team \xff\"}", 400, "name is not valid UTF-8"},
		{"description lone low surrogate", `{"name":"a","description":"\udc00"}`, 400, "description is not valid UTF-8"},
		{"slug empty", `{"name":"a","slug":""}`, 400, "slug"},
		{"slug 51", `{"name":"a","slug":"` + s(51, "a") + `"}`, 400, "50"},
		{"slug uppercase", `{"name":"a","slug":"Abc"}`, 400, "slug"},
		{"slug leading hyphen", `{"name":"a","slug":"-abc"}`, 400, "slug"},
		{"slug trailing hyphen", `{"name":"a","slug":"abc-"}`, 400, "slug"},
		{"slug double hyphen", `{"name":"a","slug":"a--b"}`, 400, "slug"},
		{"slug underscore", `{"name":"a","slug":"a_b"}`, 400, "slug"},
		{"slug wrong type", `{"name":"a","slug":1}`, 400, `"slug"`},
		{"description 501", `{"name":"a","description":"` + s(501, "d") + `"}`, 400, "500"},
		{"sampling 0", `{"name":"a","io_logging_sampling_rate":0}`, 400, "io_logging_sampling_rate"},
		{"sampling 0.00009", `{"name":"a","io_logging_sampling_rate":0.00009}`, 400, "io_logging_sampling_rate"},
		{"sampling 1.0001", `{"name":"a","io_logging_sampling_rate":1.0001}`, 400, "io_logging_sampling_rate"},
		{"sampling negative", `{"name":"a","io_logging_sampling_rate":-1}`, 400, "io_logging_sampling_rate"},
		{"sampling string", `{"name":"a","io_logging_sampling_rate":"0.5"}`, 400, `"io_logging_sampling_rate"`},
		{"provider sort unknown", `{"name":"a","default_provider_sort":"cheapest"}`, 400, "default_provider_sort"},
		{"provider sort case", `{"name":"a","default_provider_sort":"Price"}`, 400, "default_provider_sort"},
		{"bool as string", `{"name":"a","is_data_discount_logging_enabled":"true"}`, 400, `"is_data_discount_logging_enabled"`},
		{"key ids not array", `{"name":"a","io_logging_api_key_ids":"x"}`, 400, `"io_logging_api_key_ids"`},
		{"key ids not uuid", `{"name":"a","io_logging_api_key_ids":["x"]}`, 400, "io_logging_api_key_ids"},
		{"key ids unknown", `{"name":"a","io_logging_api_key_ids":["5b0e1d56-8d0c-4a5c-9a8e-000000000000"]}`, 400, "not an API key of this organization"},
		{"text model 257", `{"name":"a","default_text_model":"` + s(257, "m") + `"}`, 400, "default_text_model"},
	}
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		before := count(t, e)
		for _, c := range cases {
			status, resp, _ := e.Do(t, "POST", "/workspaces", e.ManagementKey, jsonCT, c.body)
			t.Run(c.name, func(t *testing.T) { wantError(t, status, resp, c.status, c.mention) })
		}
		if got := count(t, e); got != before {
			t.Fatalf("refused requests changed the database: %d → %d workspaces", before, got)
		}
	})
}

func TestCreateWorkspaceBounds(t *testing.T) {
	t.Parallel()
	s := strings.Repeat
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ok := []string{
			`{"name":"` + s("a", 100) + `"}`,
			`{"name":"` + s("é", 100) + `"}`,
			`{"name":"a","slug":"` + s("b", 50) + `"}`,
			`{"name":"a","slug":"a"}`,
			`{"name":"a","slug":"a-1-b2"}`,
			`{"name":"a","description":"` + s("d", 500) + `"}`,
			`{"name":"a","io_logging_sampling_rate":0.0001}`,
			`{"name":"a","io_logging_sampling_rate":1}`,
			`{"name":"a","default_provider_sort":"exacto"}`,
			`{"name":"a","default_provider_sort":"throughput"}`,
			`{"name":"a","default_text_model":"` + s("m", 256) + `"}`,
		}
		for _, body := range ok {
			status, resp, _ := e.Do(t, "POST", "/workspaces", e.ManagementKey, jsonCT, body)
			if status != http.StatusCreated {
				t.Errorf("%.60s: status %d %s", body, status, resp)
			}
		}
		// The body limit: 64 KiB of padding in a string is refused with 413.
		big := `{"name":"a","description":"` + s("d", 64<<10) + `"}`
		status, resp, _ := e.Do(t, "POST", "/workspaces", e.ManagementKey, jsonCT, big)
		wantError(t, status, resp, http.StatusRequestEntityTooLarge, "bytes")
	})
}

func TestCreateWorkspaceAuth(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		personal := e.NewKey(t, "personal", e.WorkspaceID)
		disabled := e.NewKey(t, "management", "")
		deleted := e.NewKey(t, "management", "")
		ks, _ := e.Server.Accounts.ListAPIKeys(ctx, e.Operator(), &cohortv1.ListApiKeysRequest{})
		byPrefix := map[string]string{}
		for _, k := range ks {
			byPrefix[k.GetPrefix()] = k.GetId()
		}
		body := `{"name":"a"}`
		// The disabled key works until it is disabled, then stops on the very next request.
		if status, resp, _ := e.Do(t, "POST", "/workspaces", disabled, jsonCT, body); status != 201 {
			t.Fatalf("fresh key: %d %s", status, resp)
		}
		if _, err := e.Server.Accounts.DisableAPIKey(ctx, e.Operator(), byPrefix[disabled[:14]]); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Server.Accounts.DeleteAPIKey(ctx, e.Operator(), byPrefix[deleted[:14]]); err != nil {
			t.Fatal(err)
		}
		n := count(t, e)
		cases := []struct {
			name, header string
			status       int
			mention      string
		}{
			{"no header", "", 401, "missing"},
			{"not bearer", "Basic " + e.ManagementKey, 401, "Bearer"},
			{"unknown key", "Bearer cohort_mk_" + strings.Repeat("A", 43), 401, "invalid"},
			{"garbage", "Bearer hello", 401, "invalid"},
			{"workspace key", "Bearer " + e.WorkspaceKey, 403, "management key"},
			{"personal key", "Bearer " + personal, 403, "management key"},
			{"disabled key", "Bearer " + disabled, 401, "disabled"},
			{"deleted key", "Bearer " + deleted, 401, "invalid"},
		}
		for _, c := range cases {
			req, _ := http.NewRequest("POST", e.URL+"/workspaces", strings.NewReader(body))
			if c.header != "" {
				req.Header.Set("Authorization", c.header)
			}
			res, err := e.HTTPClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			fmt.Fprint(&b, readAll(res))
			t.Run(c.name, func(t *testing.T) { wantError(t, res.StatusCode, b.String(), c.status, c.mention) })
		}
		if count(t, e) != n {
			t.Fatal("refused requests created a workspace")
		}
		for _, k := range []string{e.ManagementKey, e.WorkspaceKey, disabled, deleted, personal} {
			if strings.Contains(e.Logs(), k) {
				t.Fatal("an API key reached the logs")
			}
		}
	})
}

func readAll(res *http.Response) string {
	defer res.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := res.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// TestConnectDoor checks the Connect twin: same validation, typed errors
// with the reason detail, get and list scoped by key.
func TestConnectDoor(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		client := cohortv1connect.NewWorkspaceServiceClient(e.HTTPClient(), e.URL)
		withKey := func(k string, req any) {
			switch r := req.(type) {
			case interface{ Header() http.Header }:
				r.Header().Set("Authorization", "Bearer "+k)
			}
		}
		name := "Ops"
		req := connect.NewRequest(&cohortv1.CreateWorkspaceRequest{Name: &name})
		withKey(e.ManagementKey, req)
		res, err := client.CreateWorkspace(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res.Msg.GetData().GetSlug() != "ops" || res.Msg.GetData().GetCreatedBy() != e.AdminUserID {
			t.Fatalf("created %v", res.Msg.GetData())
		}
		bad := "Bad Slug"
		req = connect.NewRequest(&cohortv1.CreateWorkspaceRequest{Name: &name, Slug: &bad})
		withKey(e.ManagementKey, req)
		_, err = client.CreateWorkspace(ctx, req)
		if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.FromConnect(err).Status != 400 {
			t.Fatalf("bad slug over Connect: %v", err)
		}
		req = connect.NewRequest(&cohortv1.CreateWorkspaceRequest{Name: &name})
		withKey(e.WorkspaceKey, req)
		if _, err = client.CreateWorkspace(ctx, req); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("workspace key over Connect: %v", err)
		}
		// The workspace key lists only its own workspace; the management key all.
		lreq := connect.NewRequest(&cohortv1.ListWorkspacesRequest{})
		withKey(e.WorkspaceKey, lreq)
		l, err := client.ListWorkspaces(ctx, lreq)
		if err != nil || len(l.Msg.GetData()) != 1 || l.Msg.GetData()[0].GetId() != e.WorkspaceID {
			t.Fatalf("workspace key list: %v %v", l, err)
		}
		lreq = connect.NewRequest(&cohortv1.ListWorkspacesRequest{})
		withKey(e.ManagementKey, lreq)
		if l, err = client.ListWorkspaces(ctx, lreq); err != nil || len(l.Msg.GetData()) != 2 {
			t.Fatalf("management key list: %v %v", l, err)
		}
		greq := connect.NewRequest(&cohortv1.GetWorkspaceRequest{Id: res.Msg.GetData().GetId()})
		withKey(e.WorkspaceKey, greq)
		if _, err = client.GetWorkspace(ctx, greq); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("workspace key reading another workspace: %v", err)
		}
		_, err = client.ListWorkspaces(ctx, connect.NewRequest(&cohortv1.ListWorkspacesRequest{}))
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("no key: %v", err)
		}
	})
}

// TestCrossOrganization: a management key never sees or uses another
// organization's keys or workspaces.
func TestCrossOrganization(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		other, err := e.Server.Accounts.CreateOrganization(ctx, opRoot(), &cohortv1.CreateOrganizationRequest{Name: "Other"})
		if err != nil {
			t.Fatal(err)
		}
		op := opOf(other.GetId())
		u, err := e.Server.Accounts.CreateUser(ctx, op, &cohortv1.CreateUserRequest{Email: "o@x.test"})
		if err != nil {
			t.Fatal(err)
		}
		op.UserID = u.GetId()
		k, err := e.Server.Accounts.CreateAPIKey(ctx, op, &cohortv1.CreateApiKeyRequest{Kind: "management"})
		if err != nil {
			t.Fatal(err)
		}
		// The other org's key id cannot be used as a logging filter here.
		status, resp, _ := e.Do(t, "POST", "/workspaces", e.ManagementKey, jsonCT,
			fmt.Sprintf(`{"name":"a","io_logging_api_key_ids":[%q]}`, k.GetApiKey().GetId()))
		wantError(t, status, resp, 400, "not an API key of this organization")
		// And the same slug is free in another organization.
		status, resp, _ = e.Do(t, "POST", "/workspaces", k.GetKey(), jsonCT, `{"name":"d","slug":"default"}`)
		if status != 201 {
			t.Fatalf("slug in another org: %d %s", status, resp)
		}
	})
}
