package secretflow_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// TestTextBeforeAnApprovalIsNotLost: the model's text streamed just before
// an http_request that needs approval reaches the stream before the pause.
func TestTextBeforeAnApprovalIsNotLost(t *testing.T) {
	t.Parallel()
	db := storetest.SQLite(t)
	f := newFlow(t, db)
	b, _ := json.Marshal(map[string]any{"hosts": []string{"api.example.com"}, "value": "order-secret"})
	f.e.Do(t, "PUT", "/vault/interns/"+f.e.InternID+"/secrets/api_key", f.e.WorkspaceKey, "application/json", string(b))
	sid := ""
	for i := 0; i < 15; i++ {
		f.up.Push(agenttest.Step{Chunks: []string{agenttest.Text(model, "Let me call the API."),
			agenttest.ToolCallStart(model, 0, "call_x", "http_request", f.callArgs("/o")), agenttest.Finish(model, "tool_calls")}})
		body := userBody("manual", "go")
		if sid != "" {
			body = `{"stream":true,"approval_mode":"manual","session_id":"` + sid + `","messages":[{"role":"user","content":"go"}]}`
		}
		s := f.chat(t, body)
		if sid == "" {
			sid = sessionID(t, s)
		}
		if !strings.Contains(s, "Let me call the API.") {
			t.Fatalf("round %d: the text before the pause was lost: %s", i, s)
		}
		ia, _ := interaction(t, s)
		a, _ := json.Marshal(ia)
		f.up.Push(agenttest.Answer(model, 1, 1, "ok"))
		f.chat(t, `{"stream":true,"session_id":"`+sid+`","messages":[{"role":"user","content":"go"},`+
			`{"role":"assistant","content":null,"tool_calls":[{"id":`+string(a)+`,"type":"function","function":{"name":"service.provide_input","arguments":"{}"}}]},`+
			`{"role":"tool","tool_call_id":`+string(a)+`,"content":"reject_once"}]}`)
	}
}

// TestToolAfterDaemonRestart: after a restart the daemon loads the session
// (session/load) with a fresh MCP credential on a new MCP server; the
// agent reconnects and the tool works, with the conversation kept.
func TestToolAfterDaemonRestart(t *testing.T) {
	t.Parallel()
	f := newFlow(t, storetest.SQLite(t))
	b, _ := json.Marshal(map[string]any{"hosts": []string{"api.example.com"}, "value": "restart-secret"})
	f.e.Do(t, "PUT", "/vault/interns/"+f.e.InternID+"/secrets/api_key", f.e.WorkspaceKey, "application/json", string(b))
	f.up.Push(agenttest.Call(model, "c1", "http_request", f.callArgs("/one")), agenttest.Answer(model, 1, 1, "one"))
	s1 := f.chat(t, userBody("self-drive", "first"))
	sid := sessionID(t, s1)
	f.startDaemon(t)
	f.up.Push(agenttest.Call(model, "c2", "http_request", f.callArgs("/two")), agenttest.Answer(model, 1, 1, "two"))
	s2 := f.chat(t, `{"stream":true,"approval_mode":"self-drive","session_id":"`+sid+`","messages":[{"role":"user","content":"second"}]}`)
	if !strings.Contains(s2, "two") {
		t.Fatalf("after restart: %s", s2)
	}
	got := f.host.requests()
	if len(got) != 2 || !strings.Contains(got[1], "auth=Bearer restart-secret") {
		t.Fatalf("bound host after restart: %q", got)
	}
	all := f.up.Requests()
	reqs, _ := json.Marshal(all)
	last, _ := json.Marshal(all[len(all)-1])
	if strings.Contains(string(reqs), "restart-secret") || !strings.Contains(string(last), `"first"`) {
		t.Fatalf("model inputs (history must survive, value must not appear): %s", reqs)
	}
}
