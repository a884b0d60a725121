package webhooks_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/webhooks"
)

// The secret is in the create and rotate answers only: never in a get, a
// list, an update, the delivery log, or the gateway's log. After a
// rotation deliveries carry signatures by both secrets (the grace
// period), each verifiable on its own.
func TestSecretShownOnceAndRotation(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db, nil)
		rc := newReceiver(t, nil)
		ep, secret := createEndpoint(t, e, rc.URL, webhooks.RunPaused)
		key := strings.TrimPrefix(secret, "whsec_")
		noSecret := func(what, body string) {
			t.Helper()
			if strings.Contains(body, key) || strings.Contains(body, "whsec_") {
				t.Fatalf("%s shows a secret: %s", what, body)
			}
		}
		for _, c := range []struct{ method, path, body string }{
			{"GET", "/webhooks/endpoints/" + ep, ""},
			{"GET", "/webhooks/endpoints", ""},
			{"PATCH", "/webhooks/endpoints/" + ep, `{"description":"renamed","enabled":true}`},
			{"GET", "/webhooks/endpoints/" + ep + "/deliveries", ""},
		} {
			st, body, _ := e.Do(t, c.method, c.path, e.WorkspaceKey, "application/json", c.body)
			if st != 200 {
				t.Fatalf("%s %s: %d %s", c.method, c.path, st, body)
			}
			noSecret(c.method+" "+c.path, body)
		}
		st, body, _ := e.Do(t, "POST", "/webhooks/endpoints/"+ep+"/rotate-secret", e.WorkspaceKey, "", "")
		if st != 200 || !strings.Contains(body, `"secret":"whsec_`) || strings.Contains(body, key) || !strings.Contains(body, "secret_rotated_at") {
			t.Fatalf("rotate: %d %s", st, body)
		}
		newSecret := body[strings.Index(body, `"secret":"`)+10:]
		newSecret = newSecret[:strings.Index(newSecret, `"`)]

		fire(t, e, e.WorkspaceID, webhooks.RunPaused, `{"id":"run_1","status":"paused"}`)
		if n, err := worker(t, e, nil).RunOnce(context.Background()); n != 1 || err != nil {
			t.Fatalf("deliver: %d %v", n, err)
		}
		h := rc.Hits()[0]
		if len(strings.Fields(h.Signature)) != 2 {
			t.Fatalf("during the grace period: %q", h.Signature)
		}
		for _, s := range []string{secret, newSecret} {
			hd := h.headers()
			for _, sig := range strings.Fields(h.Signature) {
				hd.Set("webhook-signature", sig)
				if verify(s, hd, h.Body) == nil {
					goto ok
				}
			}
			t.Fatalf("no signature by %s…", s[:10])
		ok:
		}
		noSecret("log", e.Logs())
		noSecret("log", strings.ReplaceAll(e.Logs(), newSecret, ""))
		if strings.Contains(e.Logs(), strings.TrimPrefix(newSecret, "whsec_")) {
			t.Fatal("the log shows the rotated secret")
		}
	})
}

// Endpoint addresses pass the egress policy when saved: private,
// loopback and metadata addresses are refused with a 400 that names the
// setting, unless the operator lists them; plain http only to a listed
// receiver. The dial-time guard holds for an endpoint saved when the
// policy allowed it.
func TestEgressPolicy(t *testing.T) {
	db := storetest.SQLite(t)
	e := testenv.New(t, db) // no --webhook-allow-hosts
	for _, u := range []string{"https://127.0.0.1/hook", "https://10.1.2.3/", "https://169.254.169.254/latest", "https://[::1]/", "http://example.com/", "ftp://example.com/", "https://user:pw@example.com/"} {
		st, body, _ := e.Do(t, "POST", "/webhooks/endpoints", e.WorkspaceKey, "application/json", `{"url":"`+u+`","events":["run.paused"]}`)
		if st != 400 {
			t.Fatalf("%s: %d %s", u, st, body)
		}
		if strings.Contains(u, "127.0.0.1") && !strings.Contains(body, "--webhook-allow-hosts") {
			t.Fatalf("%s: the refusal does not name the setting: %s", u, body)
		}
	}
	// The metadata address stays refused whatever is listed.
	cfg := testenv.Config()
	cfg.Webhooks.AllowHosts = []string{"0.0.0.0/0", "127.0.0.0/8"}
	e2 := testenv.NewConfig(t, storetest.SQLite(t), cfg)
	st, body, _ := e2.Do(t, "POST", "/webhooks/endpoints", e2.WorkspaceKey, "application/json", `{"url":"http://169.254.169.254/","events":["run.paused"]}`)
	if st != 400 {
		t.Fatalf("metadata address: %d %s", st, body)
	}

	// Saved while listed; delivered by a worker whose policy does not list
	// it: refused at dial time, recorded as the attempt's error.
	rc := newReceiver(t, nil)
	createEndpoint(t, e2, rc.URL, webhooks.RunPaused)
	fire(t, e2, e2.WorkspaceID, webhooks.RunPaused, `{"id":"r"}`)
	w := &webhooks.Worker{DB: e2.DB, KEK: e2.Server.KEK}
	if n, err := w.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("%d %v", n, err)
	}
	var d []struct {
		LastError string `bun:"last_error"`
	}
	e2.DB.NewSelect().Table("webhook_deliveries").Column("last_error").Scan(context.Background(), &d)
	if len(rc.Hits()) != 0 || len(d) != 1 || !strings.Contains(d[0].LastError, "egress policy") {
		t.Fatalf("dial-time guard: %d hits, %+v", len(rc.Hits()), d)
	}
}

// The Connect door is the same service; a management key names the
// workspace; another workspace's endpoint is a 404; bad input is a 400.
func TestConnectDoorAndScope(t *testing.T) {
	db := storetest.SQLite(t)
	cfg := testenv.Config()
	cfg.Webhooks.AllowHosts = []string{"127.0.0.0/8"}
	e := testenv.NewConfig(t, db, cfg)
	rc := newReceiver(t, nil)
	c := cohortv1connect.NewWebhookServiceClient(e.HTTPClient(), e.URL)
	auth := func(key string, r connect.AnyRequest) {
		r.Header().Set("Authorization", "Bearer "+key)
	}
	req := connect.NewRequest(&cohortv1.CreateWebhookEndpointRequest{Url: rc.URL, Events: []string{"run.completed"}})
	auth(e.ManagementKey, req)
	if _, err := c.CreateWebhookEndpoint(context.Background(), req); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "workspace_id") {
		t.Fatalf("management key without workspace_id: %v", err)
	}
	req.Msg.WorkspaceId = e.WorkspaceID
	res, err := c.CreateWebhookEndpoint(context.Background(), req)
	if err != nil || !strings.HasPrefix(res.Msg.GetSecret(), "whsec_") {
		t.Fatalf("create: %v", err)
	}
	id := res.Msg.GetEndpoint().GetId()

	bad := connect.NewRequest(&cohortv1.CreateWebhookEndpointRequest{Url: rc.URL, Events: []string{"run.started"}})
	auth(e.WorkspaceKey, bad)
	if _, err := c.CreateWebhookEndpoint(context.Background(), bad); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("unknown event: %v", err)
	}

	// A workspace key of another workspace sees nothing of it.
	ws2, err := e.Server.Workspaces.Create(context.Background(), e.Operator(), &cohortv1.CreateWorkspaceRequest{Name: new("other"), Slug: new("other")})
	if err != nil {
		t.Fatal(err)
	}
	k2 := e.NewKey(t, "workspace", ws2.GetId())
	get := connect.NewRequest(&cohortv1.GetWebhookEndpointRequest{Id: id})
	auth(k2, get)
	if _, err := c.GetWebhookEndpoint(context.Background(), get); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("other workspace: %v", err)
	}
	// Disabled: events are not enqueued for it.
	upd := connect.NewRequest(&cohortv1.UpdateWebhookEndpointRequest{Id: id, Enabled: new(bool)})
	auth(e.WorkspaceKey, upd)
	if r, err := c.UpdateWebhookEndpoint(context.Background(), upd); err != nil || r.Msg.GetEndpoint().GetEnabled() {
		t.Fatalf("disable: %v", err)
	}
	fire(t, e, e.WorkspaceID, webhooks.RunCompleted, `{"id":"r"}`)
	if n, _ := e.DB.NewSelect().Table("webhook_deliveries").Count(context.Background()); n != 0 {
		t.Fatalf("%d deliveries for a disabled endpoint", n)
	}
	del := connect.NewRequest(&cohortv1.DeleteWebhookEndpointRequest{Id: id})
	auth(e.WorkspaceKey, del)
	if _, err := c.DeleteWebhookEndpoint(context.Background(), del); err != nil {
		t.Fatal(err)
	}
	st, _, _ := e.Do(t, "GET", "/webhooks/endpoints/"+id, e.WorkspaceKey, "", "")
	if st != http.StatusNotFound {
		t.Fatalf("deleted endpoint: %d", st)
	}
}
