// Package e2e_test drives the real stack as an operator runs it: `cohort
// serve` (the gateway), `cohort intern` daemons registered with `cohort
// admin intern register`, and the built-in agent `cohort agent` (the offline
// cohort/demo model, or a scripted OpenAI-compatible upstream), all as
// separate processes of the freshly built binary.
package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

const upModel = "up/model"

// upstreamEnv points a daemon's agent at a scripted upstream.
func upstreamEnv(up *agenttest.Upstream) []string {
	return []string{"COHORT_AGENT_BASE_URL=" + up.BaseURL(), "COHORT_AGENT_API_KEY=e2e-upstream-key"}
}

// TestRunStates walks every row of the spec's intern run state table through
// one real gateway, real daemons and the real built-in agent.
func TestRunStates(t *testing.T) {
	c, gw := newCluster(t, "")
	key := c.WK

	t.Run("no run to streaming to complete", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "complete"), nil)
		s := readAll(t, chat(t, gw, key, d.id, user("hello e2e")))
		if s.Finish != "stop" || s.Text != "Hello from cohort/demo. You said: hello e2e" || s.Reasoning == "" || s.Error != nil {
			t.Fatalf("stream %q %q %v", s.Finish, s.Text, s.Chunks)
		}
		if sid, _ := s.Session.(string); sid == "" {
			t.Fatalf("session %v", s.Session)
		}
		u, _ := s.Usage.(map[string]any)
		if u == nil || u["prompt_tokens"] == nil || u["completion_tokens"] == nil || u["total_tokens"] == nil {
			t.Fatalf("usage %v", s.Usage)
		}
		if m := s.Chunks[len(s.Chunks)-2]["model"]; m != "cohort/demo" {
			t.Fatalf("finish chunk model %v", m)
		}
	})

	t.Run("a remote daemon's agent gets its environment through the allowlist", func(t *testing.T) {
		t.Parallel()
		// E2E_CANARY has no secret-looking name, so the shell tool's own
		// filter would let it through: only the daemon's allowlist stops it.
		d := c.Daemon(t, c.NewIntern(t, "environ"), []string{"AWS_SECRET_ACCESS_KEY=e2e-aws", "E2E_CANARY=e2e-canary", "LANG=C.UTF-8"})
		s := readAll(t, chat(t, gw, key, d.id, user("$ echo canary=[$E2E_CANARY] aws=[$AWS_SECRET_ACCESS_KEY] lang=[$LANG] path=[$PATH]")))
		if !strings.Contains(s.Text, "canary=[] aws=[] lang=[C.UTF-8] path=[/") || strings.Contains(s.Text, "e2e-") {
			t.Fatalf("the agent's command saw %q", s.Text)
		}
	})

	t.Run("paused, caller leaves, tool reply resumes the same run under its original mode", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "pause"), nil)
		res := chatVia(t, context.Background(), hangUp, gw, key, d.id, user("$ echo resumed-e2e", `"approval_mode":"manual"`))
		s := readAll(t, res)
		// The caller leaves after [DONE]: the connection closes.
		res.Body.Close()
		if s.Finish != "tool_calls" || s.Args["kind"] != "permission" || s.Args["operation"] != "shell" || s.Usage != nil {
			t.Fatalf("pause %q %v %v", s.Finish, s.Args, s.Usage)
		}
		if fmt.Sprint(s.Args["options"]) != "[allow_once allow_always reject_once reject_always]" {
			t.Fatalf("options %v", s.Args["options"])
		}
		// The reply asks for self-drive; the run keeps the manual mode it
		// started with, so the command runs sandboxed.
		r := readAll(t, chat(t, gw, key, d.id, s.answer("allow_once", `"approval_mode":"self-drive"`)))
		if r.Finish != "stop" || !strings.Contains(r.Text, "resumed-e2e") || !strings.Contains(r.Text, `\"sandboxed\":true`) && !strings.Contains(r.Text, `"sandboxed":true`) {
			t.Fatalf("continuation %q %q", r.Finish, r.Text)
		}
		if r.Session != s.Session {
			t.Fatalf("continuation session %v, want %v", r.Session, s.Session)
		}
		// The run has ended: a second answer is not pending.
		refusal(t, chat(t, gw, key, d.id, s.answer("allow_once")), 409, "interaction_not_pending")
	})

	t.Run("question answered", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "question"), nil)
		s := readAll(t, chat(t, gw, key, d.id, user("what colour is the sky?")))
		if s.Finish != "tool_calls" || s.Args["kind"] != "elicitation" || s.Args["message"] == "" {
			t.Fatalf("question %q %v", s.Finish, s.Args)
		}
		if fmt.Sprint(s.Args["fields"]) != "[map[name:answer required:true type:string]]" {
			t.Fatalf("fields %v", s.Args["fields"])
		}
		r := readAll(t, chat(t, gw, key, d.id, s.answer(`{"action":"accept","content":{"answer":"blue"}}`)))
		if r.Finish != "stop" || !strings.Contains(r.Text, "You answered: blue") {
			t.Fatalf("answer %q %q", r.Finish, r.Text)
		}
	})

	t.Run("reply not accepted keeps the deadline; the deadline cancels the run", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "deadline"), nil, "--interaction-deadline", "4s")
		s := readAll(t, chat(t, gw, key, d.id, user("$ echo never", `"approval_mode":"manual"`)))
		if s.Finish != "tool_calls" {
			t.Fatalf("pause %q", s.Finish)
		}
		// Rejected replies every 500 ms, well inside the 4 s deadline: were
		// each to extend it, the run would never end. It ends.
		var rejected int
		testutil.Eventually(t, wait, "the deadline ends the run despite rejected replies", func() bool {
			res := chat(t, gw, key, d.id, s.answer("allow_sometimes"))
			if res.StatusCode == 400 {
				refusal(t, res, 400, "bad_request")
				rejected++
				return false
			}
			refusal(t, res, 409, "interaction_not_pending")
			return true
		})
		if rejected == 0 {
			t.Fatal("no reply was rejected while the question was pending")
		}
		// Cancelled, not paused: the session takes a new turn.
		r := readAll(t, chat(t, gw, key, d.id, user("after the deadline", `"session_id":`+jsonStr(s.Session))))
		if r.Finish != "stop" {
			t.Fatalf("after deadline %q", r.Finish)
		}
	})

	t.Run("unknown tool_call_id is 404 and leaves the pause", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "unknown"), nil)
		s := readAll(t, chat(t, gw, key, d.id, user("$ echo still-paused", `"approval_mode":"manual"`)))
		refusal(t, chat(t, gw, key, d.id, reply(s.Session.(string), "call_not_asked", "allow_once")), 404, "interaction_unknown")
		refusal(t, chat(t, gw, key, d.id, reply("never-seen-session", s.ToolCall["id"].(string), "allow_once")), 404, "interaction_unknown")
		r := readAll(t, chat(t, gw, key, d.id, s.answer("reject_once")))
		if r.Finish != "stop" {
			t.Fatalf("after the unknown replies %q %q", r.Finish, r.Text)
		}
	})

	t.Run("cancel answer ends the run with run_ended", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "cancel"), nil)
		s := readAll(t, chat(t, gw, key, d.id, user("$ echo cancelled", `"approval_mode":"manual"`)))
		r := readAll(t, chat(t, gw, key, d.id, s.answer("cancel")))
		if r.Finish != "error" || r.reason() != "410 run_ended" || len(r.Chunks) != 3 || r.Session != s.Session || r.Usage != nil {
			t.Fatalf("cancel stream %q %q %v", r.Finish, r.reason(), r.Chunks)
		}
		if m := r.Chunks[1]["model"]; m != "service/intern" {
			t.Fatalf("run_ended chunk model %v", m)
		}
		refusal(t, chat(t, gw, key, d.id, s.answer("allow_once")), 409, "interaction_not_pending")
	})

	t.Run("a daemon restart ends the paused run", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "restart"), nil)
		s := readAll(t, chat(t, gw, key, d.id, user("$ echo gone", `"approval_mode":"manual"`)))
		d.Restart(t)
		refusal(t, chat(t, gw, key, d.id, s.answer("allow_once")), 409, "interaction_not_pending")
		refusal(t, chat(t, gw, key, d.id, reply(s.Session.(string), "call_never_asked", "allow_once")), 404, "interaction_unknown")
		if r := readAll(t, chat(t, gw, key, d.id, user("hello again", `"session_id":`+jsonStr(s.Session)))); r.Finish != "stop" {
			t.Fatalf("the session after the restart %q", r.Finish)
		}
	})

	t.Run("failed after 200", func(t *testing.T) {
		t.Parallel()
		up := agenttest.NewUpstream(t, agenttest.Step{Chunks: []string{agenttest.Text(upModel, "partial answer")}, CloseMidStream: true})
		d := c.Daemon(t, c.NewIntern(t, "failed"), upstreamEnv(up), "--model", upModel)
		s := readAll(t, chat(t, gw, key, d.id, user("fail mid-turn")))
		if s.Text != "partial answer" || s.Finish != "error" || s.reason() != "502 turn_failed" || s.Usage != nil {
			t.Fatalf("failed stream %q %q %q %v", s.Text, s.Finish, s.reason(), s.Chunks)
		}
		if sid, _ := s.Session.(string); sid == "" {
			t.Fatalf("session %v", s.Session)
		}
		if m := s.Chunks[1]["model"]; m != upModel {
			t.Fatalf("content chunk model %v", m)
		}
	})

	t.Run("model idle timeout after 200", func(t *testing.T) {
		t.Parallel()
		up := agenttest.NewUpstream(t, agenttest.Step{Chunks: []string{agenttest.Text(upModel, "thinking…")}, Hang: true})
		d := c.Daemon(t, c.NewIntern(t, "timeout"), upstreamEnv(up), "--model", upModel, "--agent-command", cohortBin+" agent --model-timeout 2s")
		s := readAll(t, chat(t, gw, key, d.id, user("stall")))
		if s.Finish != "error" || s.reason() != "504 timeout" {
			t.Fatalf("timeout stream %q %q %v", s.Finish, s.reason(), s.Chunks)
		}
	})

	t.Run("busy while streaming, caller disconnect cancels the run", func(t *testing.T) {
		t.Parallel()
		up := agenttest.NewUpstream(t, agenttest.Step{Chunks: []string{agenttest.Text(upModel, "streaming…")}, Hang: true})
		d := c.Daemon(t, c.NewIntern(t, "disconnect"), upstreamEnv(up), "--model", upModel)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := open(t, chatCtx(t, ctx, gw, key, d.id, user("hang", `"session_id":"sess-disconnect"`)))
		s.until(func(s *stream) bool { return s.Text != "" })
		// A second turn in the same session while the first streams.
		refusal(t, chat(t, gw, key, d.id, user("second", `"session_id":"sess-disconnect"`)), 409, "busy")
		cancel()
		// The run is cancelled, not left behind: the session takes a new
		// turn (busy until the daemon has seen the cancellation through).
		up.Push(agenttest.Answer(upModel, 3, 2, "fresh turn"))
		testutil.Eventually(t, wait, "the session is free after the caller left", func() bool {
			res := chat(t, gw, key, d.id, user("again", `"session_id":"sess-disconnect"`))
			if res.StatusCode == 409 {
				refusal(t, res, 409, "busy")
				return false
			}
			r := readAll(t, res)
			if r.Finish != "stop" || r.Text != "fresh turn" {
				t.Fatalf("after disconnect %q %q", r.Finish, r.Text)
			}
			return true
		})
	})

	t.Run("severed by a dying daemon; then unreachable", func(t *testing.T) {
		t.Parallel()
		up := agenttest.NewUpstream(t, agenttest.Step{Chunks: []string{agenttest.Text(upModel, "about to be cut")}, Hang: true})
		d := c.Daemon(t, c.NewIntern(t, "severed"), upstreamEnv(up), "--model", upModel)
		s := open(t, chat(t, gw, key, d.id, user("cut me")))
		s.until(func(s *stream) bool { return s.Text != "" })
		d.Kill()
		s.until(func(s *stream) bool { return s.Done })
		if s.Finish != "error" || s.reason() != "502 stream_severed" || s.Chunks[len(s.Chunks)-2]["model"] != "service/intern" {
			t.Fatalf("severed %q %q %v", s.Finish, s.reason(), s.Chunks)
		}
		refusal(t, chat(t, gw, key, d.id, user("anyone there")), 502, "intern_unreachable")
	})

	t.Run("paused run bound gives 503 busy", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "bound"), nil, "--max-paused-runs", "1")
		s := readAll(t, chat(t, gw, key, d.id, user("$ echo one", `"approval_mode":"manual"`)))
		if s.Finish != "tool_calls" {
			t.Fatalf("pause %q", s.Finish)
		}
		// Another session: the daemon holds its one paused run already.
		refusal(t, chat(t, gw, key, d.id, user("hello")), 503, "busy")
		readAll(t, chat(t, gw, key, d.id, s.answer("reject_once")))
		if r := readAll(t, chat(t, gw, key, d.id, user("hello"))); r.Finish != "stop" {
			t.Fatalf("after the pause ended %q", r.Finish)
		}
	})

	t.Run("turn refused before output", func(t *testing.T) {
		t.Parallel()
		// An agent that cannot start: the daemon refuses StartTurn.
		d := c.Daemon(t, c.NewIntern(t, "refused"), nil, "--agent-command", "/nonexistent/agent")
		refusal(t, chat(t, gw, key, d.id, user("no luck")), 502, "turn_failed")
	})

	t.Run("model failing before any output still opens the stream", func(t *testing.T) {
		t.Parallel()
		// The daemon's Started opens the stream; the upstream's 5xx (after
		// the agent's two retries) is then an error chunk, not a refusal.
		fail := agenttest.Step{Status: 500, ErrorMessage: "upstream down"}
		up := agenttest.NewUpstream(t, fail, fail, fail)
		d := c.Daemon(t, c.NewIntern(t, "refused-late"), upstreamEnv(up), "--model", upModel)
		s := readAll(t, chat(t, gw, key, d.id, user("no luck")))
		if s.Finish != "error" || s.reason() != "502 turn_failed" || len(s.Chunks) != 3 {
			t.Fatalf("late refusal %q %q %v", s.Finish, s.reason(), s.Chunks)
		}
	})

	t.Run("suspended intern is not ready", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "suspended"), nil)
		// Through the gateway's Connect door, which checks the registered
		// daemon on resume (the CLI alone only changes the record).
		connectCall(t, gw, c.MK, "SuspendIntern", `{"id":"`+d.id+`"}`)
		refusal(t, chat(t, gw, key, d.id, user("hello")), 409, "intern_not_ready")
		connectCall(t, gw, c.MK, "ResumeIntern", `{"id":"`+d.id+`"}`)
		// Resume marks a remote intern running once its daemon answers
		// Status, in the background.
		testutil.Eventually(t, wait, "the resumed intern takes turns", func() bool {
			res := chat(t, gw, key, d.id, user("hello"))
			if res.StatusCode == 409 {
				refusal(t, res, 409, "intern_not_ready")
				return false
			}
			if r := readAll(t, res); r.Finish != "stop" {
				t.Fatalf("after resume %q", r.Finish)
			}
			return true
		})
	})

	t.Run("daemon with another secret rejects the gateway", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "rejected"), nil)
		d.Stop(t)
		// The same address, a secret the gateway does not hold.
		d.secretFile = d.secretFile + ".other"
		if err := writeFile(d.secretFile, "a-different-secret"); err != nil {
			t.Fatal(err)
		}
		d.proc = d.run(t, strings.TrimPrefix(d.URL, "http://"))
		refusal(t, chat(t, gw, key, d.id, user("hello")), 502, "intern_rejected")
	})

	t.Run("refusals at the door", func(t *testing.T) {
		t.Parallel()
		d := c.Daemon(t, c.NewIntern(t, "door"), nil)
		refusal(t, chat(t, gw, key, d.id, `{"stream":false,"messages":[{"role":"user","content":"x"}]}`), 400, "bad_request")
		refusal(t, chat(t, gw, key, "no-such-intern", user("x")), 404, "not_found")
		// The body bound: exactly 1 MiB streams, one byte more is 413.
		at := padTo(user("at the bound"), 1<<20)
		if r := readAll(t, chat(t, gw, key, d.id, at)); r.Finish != "stop" {
			t.Fatalf("at the bound %q", r.Finish)
		}
		refusal(t, chat(t, gw, key, d.id, padTo(user("past the bound"), 1<<20+1)), 413, "payload_too_large")
		res := chat(t, gw, "cohort_wk_not_a_key", d.id, user("x"))
		raw, _ := io.ReadAll(res.Body)
		if res.StatusCode != 401 || strings.Contains(string(raw), "metadata") {
			t.Fatalf("401: %d %s", res.StatusCode, raw)
		}
	})
}

// padTo grows a JSON request body to exactly n bytes with an ignored field.
func padTo(body string, n int) string {
	pad := n - len(body) - len(`,"pad":""`)
	return body[:len(body)-1] + `,"pad":"` + strings.Repeat("x", pad) + `"}`
}

// connectCall calls an InternService method over Connect's JSON protocol.
func connectCall(t *testing.T, gw *proc, key, method, body string) {
	t.Helper()
	req, _ := http.NewRequest("POST", gw.URL+"/api/v1/cohort.v1.InternService/"+method, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("%s: %d %s", method, res.StatusCode, raw)
	}
}

func jsonStr(v any) string { return fmt.Sprintf("%q", v) }
