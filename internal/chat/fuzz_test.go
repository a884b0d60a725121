package chat_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// FuzzChatCompletions: whatever the body and its Content-Type, the chat's
// REST door answers 200 with an event stream or a JSON completion, or a
// 4xx in the family's shape; never a 5xx.
func FuzzChatCompletions(f *testing.F) {
	for _, seed := range [][2]string{
		{`{"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "application/json"},
		{`{"messages":[{"role":"user","content":"hi"}]}`, ""},
		{`{"stream":true,"approval_mode":"manual","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`, "application/json"},
		{`{"stream":true,"session_id":"s","messages":[{"role":"tool","tool_call_id":"i","content":"allow_once"}]}`, "application/json"},
		{`{"stream":true,"messages":[{"role":"user","content":"\ud800"}]}`, "application/json"},
		{`{"stream":"yes","messages":[]}`, "application/json"},
		{`{"messages":[{"role":"system"}]}`, "text/plain"},
		{`[`, "application/json"},
	} {
		f.Add(seed[0], seed[1])
	}
	e := newEnv(f, storetest.SQLite(f))
	e.d.set(okScript, okScript)
	f.Fuzz(func(t *testing.T, body, ct string) {
		if !testenv.SendableHeader(ct) {
			t.Skip()
		}
		status, resp, h := e.Do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey, ct, body)
		switch {
		case status == http.StatusOK:
			if ct := h.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") && !strings.HasPrefix(ct, "application/json") {
				t.Fatalf("200 with Content-Type %q: %s", ct, resp)
			}
		case status >= 400 && status < 500:
			if err := testenv.ErrorShape(status, resp); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("status %d for %q (%q): %s", status, body, ct, resp)
		}
	})
}
