package secretflow_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestGatewayReleaseNeedsTheInternsDaemonSecret: InternGatewayService
// answers only the credential the intern's own daemon derives from its
// secret, the same 401 for an unknown intern, a wrong secret, another
// intern's secret, the secret itself or what the gateway presents to the
// daemon (captured in the jail and replayed), and writes no audit row for
// a caller it did not authenticate.
func TestGatewayReleaseNeedsTheInternsDaemonSecret(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		b, _ := json.Marshal(map[string]any{"hosts": []string{"api.example.com"}, "value": "gw-secret-value"})
		if st, body, _ := e.Do(t, "PUT", "/vault/interns/"+e.InternID+"/secrets/api_key", e.WorkspaceKey, "application/json", string(b)); st != 201 {
			t.Fatal(st, body)
		}
		const secret = "the-daemon-secret"
		ct, err := e.Server.KEK.Wrap([]byte(secret), []byte("cohort/intern-daemon-secret/"+e.InternID))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.DB.NewUpdate().Model((*store.Intern)(nil)).Set("daemon_secret = ?", base64.StdEncoding.EncodeToString(ct)).Where("id = ?", e.InternID).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		daemonCred := launch.DaemonCredential(secret)
		c := cohortv1connect.NewInternGatewayServiceClient(e.HTTPClient(), e.URL)
		call := func(tok, intern, host string) (string, error) {
			r := connect.NewRequest(&cohortv1.ReleaseSecretRequest{InternId: intern, Name: "api_key", Host: host, RunId: "run-9"})
			if tok != "" {
				r.Header().Set("Authorization", "Bearer "+tok)
			}
			res, err := c.ReleaseSecret(ctx, r)
			if err != nil {
				return "", err
			}
			return res.Msg.GetValue(), nil
		}
		for _, bad := range []struct{ tok, intern string }{
			{"", e.InternID}, {"wrong", e.InternID}, {daemonCred + "x", e.InternID}, {daemonCred, "00000000-0000-0000-0000-000000000000"},
			{daemonCred, "not-a-uuid"}, {e.WorkspaceKey, e.InternID}, {e.ManagementKey, e.InternID},
			// The secret itself, and what the gateway presents to the
			// daemon: a program in the jail that captured it has nothing.
			{secret, e.InternID}, {launch.GatewayCredential(secret), e.InternID},
		} {
			if _, err := call(bad.tok, bad.intern, "api.example.com"); connect.CodeOf(err) != connect.CodeUnauthenticated || strings.Contains(err.Error(), "gw-secret-value") {
				t.Fatalf("%+v: %v", bad, err)
			}
		}
		n, _ := e.DB.NewSelect().Model((*store.VaultRelease)(nil)).Count(ctx)
		if n != 0 {
			t.Fatalf("unauthenticated calls were audited: %d", n)
		}
		if v, err := call(daemonCred, e.InternID, "API.Example.COM."); err != nil || v != "gw-secret-value" {
			t.Fatalf("release: %q %v", v, err)
		}
		_, err = call(daemonCred, e.InternID, "www.api.example.com")
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), `not bound to host "www.api.example.com"`) {
			t.Fatalf("other host: %v", err)
		}
		var rows []store.VaultRelease
		e.DB.NewSelect().Model(&rows).Order("created_at").Scan(ctx)
		if len(rows) != 2 || rows[0].Actor != "daemon:"+e.InternID || *rows[0].RunID != "run-9" || rows[1].Outcome != "refused" {
			t.Fatalf("audit: %+v", rows)
		}
		if strings.Contains(e.Logs(), "gw-secret-value") || strings.Contains(e.Logs(), secret) || strings.Contains(e.Logs(), daemonCred) {
			t.Fatal("a secret reached the gateway log")
		}
	})
}

// TestManualModeRejectAndMalformedCalls: in manual mode a rejected request
// is never sent (and nothing is released); malformed arguments go back to
// the model as an error it can act on; the MCP endpoint refuses callers
// without a session credential.
func TestManualModeRejectAndMalformedCalls(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFlow(t, db)
		f.up.Push(
			agenttest.Call(model, "call_1", "http_request", `{"url":"https://api.example.com/","bogus":1}`),
			agenttest.Answer(model, 10, 5, "Bad args."),
			agenttest.Call(model, "call_2", "http_request", f.callArgs("/v1/rejected")),
			agenttest.Answer(model, 10, 5, "Rejected."),
		)
		b, _ := json.Marshal(map[string]any{"hosts": []string{"api.example.com"}, "value": "manual-secret-value"})
		f.e.Do(t, "PUT", "/vault/interns/"+f.e.InternID+"/secrets/api_key", f.e.WorkspaceKey, "application/json", string(b))

		s1 := f.chat(t, userBody("manual", "bad call"))
		if !strings.Contains(s1, "Bad args.") {
			t.Fatalf("turn 1: %s", s1)
		}
		sid := sessionID(t, s1)
		s2 := f.chat(t, `{"stream":true,"approval_mode":"manual","session_id":"`+sid+`","messages":[{"role":"user","content":"call"}]}`)
		ia, op := interaction(t, s2)
		if op != "http_request" {
			t.Fatalf("operation %q", op)
		}
		a, _ := json.Marshal(ia)
		s3 := f.chat(t, `{"stream":true,"session_id":"`+sid+`","messages":[{"role":"user","content":"call"},`+
			`{"role":"assistant","content":null,"tool_calls":[{"id":`+string(a)+`,"type":"function","function":{"name":"service.provide_input","arguments":"{}"}}]},`+
			`{"role":"tool","tool_call_id":`+string(a)+`,"content":"reject_once"}]}`)
		if !strings.Contains(s3, "Rejected.") {
			t.Fatalf("turn 2 after reject: %s", s3)
		}
		// A request that cannot go is refused without asking the caller.
		f.up.Push(agenttest.Call(model, "call_3", "http_request", strings.Replace(f.callArgs("/x"), "https://", "http://", 1)),
			agenttest.Answer(model, 10, 5, "Not https."))
		s4 := f.chat(t, `{"stream":true,"approval_mode":"manual","session_id":"`+sid+`","messages":[{"role":"user","content":"plain"}]}`)
		if !strings.Contains(s4, "Not https.") || strings.Contains(s4, "tool_calls") {
			t.Fatalf("shape refusal asked the caller: %s", s4)
		}
		reqs, _ := json.Marshal(f.up.Requests())
		if !strings.Contains(string(reqs), "only https URLs") {
			t.Fatalf("the model was not told about https: %s", reqs)
		}
		if !strings.Contains(string(reqs), `unknown field \\\"bogus\\\"`) || !strings.Contains(string(reqs), "the user rejected this request") {
			t.Fatalf("the model was not told: %s", reqs)
		}
		if len(f.host.requests()) != 0 {
			t.Fatalf("requests went out: %q", f.host.requests())
		}
		if n, _ := f.e.DB.NewSelect().Model((*store.VaultRelease)(nil)).Count(context.Background()); n != 0 {
			t.Fatalf("a rejected request was released: %d audit rows", n)
		}
	})
}

func TestMCPEndpointNeedsASessionCredential(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFlow(t, db)
		for _, auth := range []string{"", "Bearer ", "Bearer guessed-token"} {
			req, _ := http.NewRequest("POST", f.daemon.ToolsURL(), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != 401 {
				t.Fatalf("%q: %d", auth, res.StatusCode)
			}
		}
		if !strings.HasPrefix(f.daemon.ToolsURL(), "http://127.0.0.1:") {
			t.Fatalf("MCP server not on loopback: %s", f.daemon.ToolsURL())
		}
	})
}
