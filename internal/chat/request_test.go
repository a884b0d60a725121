package chat_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/uptrace/bun"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// okScript answers every turn with a short complete reply.
var okScript = events(nil, started("sess-1"), textEv("m", "ok"), stopEv("m"))

// padded returns a valid request of exactly n bytes, padded with an ignored
// top-level field.
func padded(t *testing.T, n int) string {
	base := `{"stream":true,"messages":[{"role":"user","content":"hi"}],"pad":""}`
	pad := n - len(base)
	if pad < 0 {
		t.Fatal("n too small")
	}
	b := strings.Replace(base, `"pad":""`, `"pad":"`+strings.Repeat("x", pad)+`"`, 1)
	if len(b) != n {
		t.Fatalf("built %d bytes, want %d", len(b), n)
	}
	return b
}

func TestRequestRules(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db)
		e.d.set(okScript, okScript)
		before := internRow(t, e)
		s := func(n int, c string) string { return strings.Repeat(c, n) }
		tool := func(sid, id string) string { return toolBody(sid, id, "allow_once") }
		cases := []struct {
			name   string
			body   string
			status int
			field  string // the message must name it
		}{
			// Body size: 1 MiB is the bound.
			{"body at 1 MiB", padded(t, 1<<20), 200, ""},
			{"body past 1 MiB", padded(t, 1<<20+1), 413, ""},
			// stream must be true.
			{"stream omitted", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "stream"},
			{"stream false", `{"stream":false,"messages":[{"role":"user","content":"hi"}]}`, 400, "stream"},
			{"stream null", `{"stream":null,"messages":[{"role":"user","content":"hi"}]}`, 400, "stream"},
			{"stream as string", `{"stream":"true","messages":[{"role":"user","content":"hi"}]}`, 400, "stream"},
			// Body shape.
			{"empty body", ``, 400, "body"},
			{"malformed JSON", `{"stream":true,`, 400, "JSON"},
			{"array body", `[1]`, 400, "object"},
			{"trailing data", `{"stream":true,"messages":[{"role":"user","content":"hi"}]} x`, 400, "JSON"},
			// messages: at least 1.
			{"messages omitted", `{"stream":true}`, 400, "messages"},
			{"messages empty", `{"stream":true,"messages":[]}`, 400, "messages"},
			{"messages one item", `{"stream":true,"messages":[{"role":"user","content":"hi"}]}`, 200, ""},
			{"messages not an array", `{"stream":true,"messages":{"role":"user"}}`, 400, "messages"},
			{"message not an object", `{"stream":true,"messages":["hi"]}`, 400, "messages[0]"},
			{"role missing", `{"stream":true,"messages":[{"content":"hi"}]}`, 400, "messages[0].role"},
			{"role unknown", `{"stream":true,"messages":[{"role":"robot","content":"hi"}]}`, 400, "messages[0].role"},
			{"role not a string", `{"stream":true,"messages":[{"role":1,"content":"hi"}]}`, 400, "messages[0].role"},
			{"last message assistant", `{"stream":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}`, 400, "messages[1].role"},
			{"last message system", `{"stream":true,"messages":[{"role":"system","content":"hi"}]}`, 400, "messages[0].role"},
			// Message fields by role.
			{"user content missing", `{"stream":true,"messages":[{"role":"user"}]}`, 400, "messages[0].content"},
			{"system content missing", `{"stream":true,"messages":[{"role":"system"},{"role":"user","content":"hi"}]}`, 400, "messages[0].content"},
			{"developer content missing", `{"stream":true,"messages":[{"role":"developer"},{"role":"user","content":"hi"}]}`, 400, "messages[0].content"},
			{"earlier null contents accepted", `{"stream":true,"messages":[{"role":"system","content":null},{"role":"developer","content":null},{"role":"assistant"},{"role":"user","content":"hi"}]}`, 200, ""},
			{"last user content null", `{"stream":true,"messages":[{"role":"user","content":null}]}`, 400, "messages[0].content"},
			{"content a number", `{"stream":true,"messages":[{"role":"user","content":7}]}`, 400, "messages[0].content"},
			{"content text parts", `{"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`, 200, ""},
			{"content image part", `{"stream":true,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].type"},
			{"content part without text", `{"stream":true,"messages":[{"role":"user","content":[{"type":"text"}]}]}`, 400, "messages[0].content[0].text"},
			{"content part not an object", `{"stream":true,"messages":[{"role":"user","content":["a"]}]}`, 400, "messages[0].content[0]"},
			// Prompt: 32000 characters (not bytes: each é is 2 bytes).
			{"prompt at 32000 characters", userBody(s(32000, "é")), 200, ""},
			{"prompt past 32000 characters", userBody(s(32001, "é")), 400, "messages[1].content"},
			{"prompt parts past 32000 characters", `{"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"` + s(16000, "a") + `"},{"type":"text","text":"` + s(16001, "b") + `"}]}]}`, 400, "messages[0].content"},
			// approval_mode.
			{"approval_mode manual", userBody("hi", `,"approval_mode":"manual"`), 200, ""},
			{"approval_mode self-drive", userBody("hi", `,"approval_mode":"self-drive"`), 200, ""},
			{"approval_mode unknown", userBody("hi", `,"approval_mode":"auto"`), 400, "approval_mode"},
			{"approval_mode empty", userBody("hi", `,"approval_mode":""`), 400, "approval_mode"},
			{"approval_mode a number", userBody("hi", `,"approval_mode":1`), 400, "approval_mode"},
			// model: 1 to 256, never used.
			{"model at 256", `{"stream":true,"model":"` + s(256, "m") + `","messages":[{"role":"user","content":"hi"}]}`, 200, ""},
			{"model past 256", `{"stream":true,"model":"` + s(257, "m") + `","messages":[{"role":"user","content":"hi"}]}`, 400, "model"},
			{"model empty", `{"stream":true,"model":"","messages":[{"role":"user","content":"hi"}]}`, 400, "model"},
			{"model a number", `{"stream":true,"model":4,"messages":[{"role":"user","content":"hi"}]}`, 400, "model"},
			// session_id: 1 to 256.
			{"session_id at 256", userBody("hi", `,"session_id":"`+s(256, "ß")+`"`), 200, ""},
			{"session_id past 256", userBody("hi", `,"session_id":"`+s(257, "s")+`"`), 400, "session_id"},
			{"session_id empty", userBody("hi", `,"session_id":""`), 400, "session_id"},
			{"session_id a number", userBody("hi", `,"session_id":5`), 400, "session_id"},
			// Tool replies: session_id required, tool_call_id 1 to 128.
			{"tool reply", tool("sess-1", "int-1"), 200, ""},
			{"tool reply without session_id", `{"stream":true,"messages":[{"role":"tool","tool_call_id":"int-1","content":"allow_once"}]}`, 400, "session_id"},
			{"tool_call_id at 128", tool("sess-1", s(128, "i")), 200, ""},
			{"tool_call_id past 128", `{"stream":true,"session_id":"s","messages":[{"role":"tool","tool_call_id":"` + s(129, "i") + `","content":"allow_once"}]}`, 400, "messages[0].tool_call_id"},
			{"tool_call_id empty", `{"stream":true,"session_id":"s","messages":[{"role":"tool","tool_call_id":"","content":"allow_once"}]}`, 400, "messages[0].tool_call_id"},
			{"tool_call_id missing", `{"stream":true,"session_id":"s","messages":[{"role":"tool","content":"allow_once"}]}`, 400, "messages[0].tool_call_id"},
			{"tool content missing", `{"stream":true,"session_id":"s","messages":[{"role":"tool","tool_call_id":"i"}]}`, 400, "messages[0].content"},
			{"tool content null", `{"stream":true,"session_id":"s","messages":[{"role":"tool","tool_call_id":"i","content":null}]}`, 400, "messages[0].content"},
			{"echoed tool call id at 128", `{"stream":true,"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"` + s(128, "i") + `","type":"function","function":{"name":"service.provide_input","arguments":"{}"}}]},{"role":"user","content":"hi"}]}`, 200, ""},
			{"echoed tool call id past 128", `{"stream":true,"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"` + s(129, "i") + `","type":"function","function":{"name":"service.provide_input","arguments":"{}"}}]},{"role":"user","content":"hi"}]}`, 400, "messages[0].tool_calls[0].id"},
			{"echoed tool call id empty", `{"stream":true,"messages":[{"role":"assistant","tool_calls":[{"id":""}]},{"role":"user","content":"hi"}]}`, 400, "messages[0].tool_calls[0].id"},
			{"echoed tool call id missing", `{"stream":true,"messages":[{"role":"assistant","tool_calls":[{"type":"function"}]},{"role":"user","content":"hi"}]}`, 400, "messages[0].tool_calls[0].id"},
			{"echoed tool call arguments not a string", `{"stream":true,"messages":[{"role":"assistant","tool_calls":[{"id":"a","function":{"name":"x","arguments":{}}}]},{"role":"user","content":"hi"}]}`, 400, "messages[0].tool_calls[0].function.arguments"},
			{"tool_calls not an array", `{"stream":true,"messages":[{"role":"assistant","tool_calls":{}},{"role":"user","content":"hi"}]}`, 400, "messages[0].tool_calls"},
			// Other OpenAI fields are ignored, unknown ones too.
			{"other fields ignored", `{"stream":true,"temperature":0.2,"tools":[{"type":"function"}],"stream_options":{"include_usage":true},"x_unknown":{"a":[1]},"messages":[{"role":"user","content":"hi","name":"bob"}]}`, 200, ""},
		}
		for _, c := range cases {
			n := e.d.ncalls()
			status, body, _ := e.chat(t, c.body)
			switch c.status {
			case 200:
				if status != 200 {
					t.Errorf("%s: status %d, body %s", c.name, status, body)
					continue
				}
				parseStream(t, body)
				if e.d.ncalls() != n+1 {
					t.Errorf("%s: the daemon was not called once", c.name)
				}
			case 413:
				wantRefusal(t, status, body, 413, "payload_too_large")
			default:
				eb := wantRefusal(t, status, body, c.status, "bad_request")
				if !strings.Contains(eb.Error.Message, c.field) {
					t.Errorf("%s: message %q does not name %q", c.name, eb.Error.Message, c.field)
				}
			}
			if c.status != 200 && e.d.ncalls() != n {
				t.Errorf("%s: the daemon was called for a refused request", c.name)
			}
		}
		if after := internRow(t, e); after != before {
			t.Errorf("intern row changed: %v → %v", before, after)
		}
	})
}

func internRow(t *testing.T, e *env) string {
	var in store.Intern
	if err := e.DB.NewSelect().Model(&in).Where("id = ?", e.InternID).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(in)
	return string(b)
}

// TestRequestReachesDaemon checks what the daemon is asked: the last
// message's text, the approval mode with its default, the session id, and
// for a tool reply the answer to the named interaction.
func TestRequestReachesDaemon(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db)
		e.d.set(okScript, okScript)
		mustOK := func(body string) {
			t.Helper()
			if status, b, _ := e.chat(t, body); status != 200 {
				t.Fatalf("status %d: %s", status, b)
			}
		}
		mustOK(userBody("first"))
		mustOK(userBody("second", `,"approval_mode":"manual","session_id":"sess-9"`))
		mustOK(`{"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"a "},{"type":"text","text":"b"}]}]}`)
		mustOK(toolBody("sess-9", "int-7", `{"action":"accept","content":{"colour":"red"}}`))
		// JSON, declared as such or not declared; another type is a 415
		// that says what to send, and reaches no daemon.
		for _, ct := range []string{"", "application/json; charset=utf-8", "application/vnd.api+json"} {
			if status, b, _ := e.Do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey, ct, userBody("typed")); status != 200 {
				t.Errorf("content type %q: %d %s", ct, status, b)
			}
		}
		for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x", "nonsense;;"} {
			status, b, _ := e.Do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey, ct, userBody("typed"))
			if status != 415 || !strings.Contains(b, `"reason":"bad_request"`) || !strings.Contains(b, "application/json") {
				t.Errorf("content type %q: %d %s", ct, status, b)
			}
		}
		starts, answers := e.d.calls()
		want := []*interndv1.StartTurnRequest{
			{Prompt: "first", ApprovalMode: interndv1.ApprovalMode_APPROVAL_MODE_SELF_DRIVE},
			{Prompt: "second", SessionId: "sess-9", ApprovalMode: interndv1.ApprovalMode_APPROVAL_MODE_MANUAL},
			{Prompt: "a b", ApprovalMode: interndv1.ApprovalMode_APPROVAL_MODE_SELF_DRIVE},
		}
		if len(starts) != len(want)+3 {
			t.Fatalf("%d starts", len(starts))
		}
		for i := range want {
			if starts[i].GetPrompt() != want[i].GetPrompt() || starts[i].GetSessionId() != want[i].GetSessionId() || starts[i].GetApprovalMode() != want[i].GetApprovalMode() {
				t.Errorf("start %d = %v, want %v", i, starts[i], want[i])
			}
			// The workspace key is the caller the daemon bounds.
			if !strings.HasPrefix(starts[i].GetCaller(), "key:") || len(starts[i].GetCaller()) < 10 {
				t.Errorf("start %d caller %q", i, starts[i].GetCaller())
			}
		}
		if len(answers) != 1 || answers[0].GetSessionId() != "sess-9" || answers[0].GetInteractionId() != "int-7" ||
			answers[0].GetAnswer() != `{"action":"accept","content":{"colour":"red"}}` {
			t.Errorf("answers = %v", answers)
		}
	})
}
