package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/modelserver"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// agentModules is the node_modules directory `npm install --no-save` in agents/ makes.
func agentModules(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "agents", "node_modules")
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// requireAgent skips (or, under COHORT_REQUIRE_AGENTS=1 as in CI, fails)
// when the agent is not installed.
func requireAgent(t *testing.T, p agents.Profile) string {
	t.Helper()
	modules := agentModules(t)
	if _, err := os.Stat(filepath.Join(modules, ".bin", p.Bin)); err != nil {
		if os.Getenv("COHORT_REQUIRE_AGENTS") == "1" {
			t.Fatalf("%s is not installed (npm install --no-save in agents/): %v", p, err)
		}
		t.Skipf("%s is not installed: run npm install --no-save in agents/", p)
	}
	return modules
}

// shellCalls is each agent's own shell tool, as its model calls it.
var shellCalls = map[string]func(command string) modelserver.Call{
	"gemini": func(command string) modelserver.Call {
		args, _ := json.Marshal(map[string]string{"command": command, "description": "Run the command"})
		return modelserver.Call{Name: "run_shell_command", Arguments: string(args)}
	},
	"codex": func(command string) modelserver.Call {
		args, _ := json.Marshal(map[string]any{"cmd": command})
		return modelserver.Call{Name: "exec_command", Arguments: string(args)}
	},
	"claude": func(command string) modelserver.Call {
		args, _ := json.Marshal(map[string]string{"command": command, "description": "Run the command"})
		return modelserver.Call{Name: "Bash", Arguments: string(args)}
	},
	"opencode": func(command string) modelserver.Call {
		args, _ := json.Marshal(map[string]string{"command": command, "description": "Run the command"})
		return modelserver.Call{Name: "bash", Arguments: string(args)}
	},
}

// keepsHistory are the agents that load a session after their jail
// restarted (session/load); Gemini CLI 0.61 finds no stored session and the
// daemon starts a new one under the same id (docs/agents.md).
var keepsHistory = map[string]bool{"claude": true, "codex": true, "opencode": true}

// asksByElicitation are the agents whose question tool reaches the caller
// (ACP elicitation): Claude Code's AskUserQuestion. Codex refuses its
// request_user_input outside Plan mode; Gemini CLI and OpenCode ask no
// questions through ACP (docs/agents.md).
var asksByElicitation = map[string]bool{"claude": true}

// reportsUsage are the agents that report a turn's token usage over ACP.
var reportsUsage = map[string]bool{"claude": true, "opencode": true}

// remembersAlways are the agents that keep an allow_always for the rest of
// the session; Claude Code asks again for this compound command.
var remembersAlways = map[string]bool{"codex": true, "gemini": true, "opencode": true}

// rejectEndsTurn are the agents that end their turn when a command is
// rejected, instead of telling the model and going on.
var rejectEndsTurn = map[string]bool{"codex": true}

// script is the scripted model every agent talks to: a prompt
// "cohort-run: CMD" calls the agent's shell tool with CMD; a tool result is
// answered with "tool said: RESULT"; "cohort-say: X" is echoed. It records the real key
// each request carried.
type script struct {
	agent  string
	target string // the bound host's host:port (cohort-http)
	// httpCalled: the one http_request call of the test was made.
	httpCalled bool
	mu         sync.Mutex
	keys       []string
}

func (s *script) reply(turn modelserver.Turn) modelserver.Reply {
	s.mu.Lock()
	for _, h := range []string{"Authorization", "X-Api-Key", "X-Goog-Api-Key"} {
		if v := turn.Header.Get(h); v != "" {
			s.keys = append(s.keys, strings.TrimPrefix(v, "Bearer "))
		}
	}
	s.mu.Unlock()
	if path, ok := marked(turn.User, "cohort-http: "); ok && len(turn.ToolResults) < 2 {
		if r, ok := s.httpRequest(turn, path); ok {
			return r
		}
	}
	if n := len(turn.ToolResults); n > 0 {
		return modelserver.Reply{Text: "tool said: " + turn.ToolResults[n-1], InputTokens: 21, OutputTokens: 5}
	}
	if q, ok := marked(turn.User, "cohort-ask: "); ok && len(turn.ToolResults) == 0 {
		// The agent's own question tool.
		opts := []map[string]string{{"label": "red", "description": "warm"}, {"label": "blue", "description": "cool"}}
		switch {
		case slices.Contains(turn.Tools, "AskUserQuestion"):
			args, _ := json.Marshal(map[string]any{"questions": []any{map[string]any{"question": q, "header": "Color", "options": opts, "multiSelect": false}}})
			return modelserver.Reply{Calls: []modelserver.Call{{Name: "AskUserQuestion", Arguments: string(args)}}, InputTokens: 13, OutputTokens: 3}
		case slices.Contains(turn.Tools, "request_user_input"):
			args, _ := json.Marshal(map[string]any{"questions": []any{map[string]any{"id": "color", "header": "Color", "question": q, "options": opts}}})
			return modelserver.Reply{Calls: []modelserver.Call{{Name: "request_user_input", Arguments: string(args)}}, InputTokens: 13, OutputTokens: 3}
		}
	}
	if cmd, ok := marked(turn.User, "cohort-announce: "); ok {
		return modelserver.Reply{Text: "running it", Calls: []modelserver.Call{shellCalls[s.agent](cmd)}, InputTokens: 13, OutputTokens: 3}
	}
	if cmd, ok := marked(turn.User, "cohort-run: "); ok {
		return modelserver.Reply{Calls: []modelserver.Call{shellCalls[s.agent](cmd)}, InputTokens: 13, OutputTokens: 3}
	}
	said, _ := marked(turn.User, "cohort-say: ")
	return modelserver.Reply{Text: "echo: " + said, InputTokens: 11, OutputTokens: 2}
}

// marked returns the rest of the line after marker in a prompt (agents add
// their own text around the user's).
func marked(prompt, marker string) (string, bool) {
	i := strings.LastIndex(prompt, marker)
	if i < 0 {
		return "", false
	}
	rest, _, _ := strings.Cut(prompt[i+len(marker):], "\n")
	return strings.TrimSpace(rest), true
}

// httpRequest calls the daemon's http_request once, under the name the
// agent gives its MCP tools, with the bound secret's placeholder. Claude
// Code defers MCP tools until the model searches for them.
func (s *script) httpRequest(turn modelserver.Turn, path string) (modelserver.Reply, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.httpCalled {
		return modelserver.Reply{}, false
	}
	for _, name := range turn.Tools {
		if strings.HasSuffix(name, "http_request") {
			s.httpCalled = true
			args, _ := json.Marshal(map[string]any{"url": "https://" + s.target + path,
				"headers": map[string]string{"Authorization": "Bearer {{secret:target_token}}"}})
			return modelserver.Reply{Calls: []modelserver.Call{{Name: name, Arguments: string(args)}}, InputTokens: 13, OutputTokens: 3}, true
		}
	}
	if slices.Contains(turn.Tools, "ToolSearch") && len(turn.ToolResults) == 0 {
		return modelserver.Reply{Calls: []modelserver.Call{{Name: "ToolSearch", Arguments: `{"query":"select:mcp__cohort__http_request","max_results":5}`}}, InputTokens: 13, OutputTokens: 3}, true
	}
	return modelserver.Reply{Text: fmt.Sprintf("no http_request among %v", turn.Tools), InputTokens: 13, OutputTokens: 3}, true
}

func (s *script) sawKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// agentGateway is a jailed gateway whose catalog holds the installed agent,
// pointed at a scripted model, and an intern running it whose provider key
// is in its vault, bound to the model's host.
type agentGateway struct {
	c      *cluster
	gw     *proc
	model  *modelserver.Server
	script *script
	intern string
	key    string
	target *boundTarget
	secret string // the value of target_token, bound to target.localhost
}

func newAgentGateway(t *testing.T, p agents.Profile, extra ...string) *agentGateway {
	t.Helper()
	modules := requireAgent(t, p)
	a := &agentGateway{script: &script{agent: p.Name}, key: randomCanary("provider-key"), target: startBoundTarget(t), secret: randomCanary("target-token")}
	a.script.target = a.target.Host
	a.model = modelserver.Start(t, a.script.reply)
	dataDir := t.TempDir()
	a.c = &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	// A Node agent's first session/new took over 30 s (the default
	// first-event budget) on a loaded 2-core machine: these tests check what
	// the agents do, not how fast they start.
	// extra comes last: a later --provisioner is the one that counts.
	a.gw = a.c.Gateway(t, append([]string{"--provisioner", "local", "--log-level", "info", "--first-event-timeout", agentFirstEvent,
		"--intern-egress-allow-hosts", "127.0.0.1/32", "--http-tool-ca-file", a.target.CAFile,
		"--agent-modules", modules, "--agent-endpoint", p.Name + "=http://model.localhost:" + a.model.Addr[strings.LastIndex(a.model.Addr, ":")+1:]}, extra...)...)
	a.c.load(t)
	a.intern = createAgentIntern(t, a.gw, a.c.WK, p.Name)
	// The provider key, bound to the model endpoint's host only (the vault
	// takes DNS names with a dot: the endpoint is model.localhost, which
	// the relay dials on loopback).
	a.putSecret(t, p.KeySecret, "model.localhost", a.key)
	a.putSecret(t, "target_token", "target.localhost", a.secret)
	return a
}

// putSecret stores an intern secret bound to one host.
func (a *agentGateway) putSecret(t *testing.T, name, host, value string) {
	t.Helper()
	body := `{"hosts":["` + host + `"],"value":"` + value + `"}`
	req, _ := http.NewRequest("PUT", a.gw.URL+"/api/v1/vault/interns/"+a.intern+"/secrets/"+name, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+a.c.WK)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 201 {
		t.Fatalf("vault put %s: %v %v", name, err, res)
	}
	res.Body.Close()
}

// createAgentIntern creates an intern running agent through the API.
func createAgentIntern(t *testing.T, gw *proc, key, agent string) string {
	t.Helper()
	in := createInternWith(t, gw, key, `{"name":"`+agent+`","agent":"`+agent+`"}`)
	if in["agent"] != agent {
		t.Fatalf("created intern runs %q, want %q", in["agent"], agent)
	}
	return in["id"]
}

// turn runs one chat turn to its end.
func (a *agentGateway) turn(t *testing.T, prompt string, extra ...string) *stream {
	t.Helper()
	return readAll(t, chat(t, a.gw, a.c.WK, a.intern, user(prompt, extra...)))
}

// TestThirdPartyAgents runs every known agent as a real intern behind the
// real gateway, jailed, against a scripted model: the compatibility matrix
// of docs/agents.md, row by row.
// agentFirstEvent is the third-party agent tests' first-event budget.
const agentFirstEvent = "3m"

func TestThirdPartyAgents(t *testing.T) {
	for _, p := range agents.All() {
		if shellCalls[p.Name] == nil {
			t.Errorf("%s: no shell call scripted", p.Name)
			continue
		}
		// One agent at a time: four agents, their gateways and jails at once
		// overload a 2-core machine into timeouts that test nothing.
		t.Run(p.Name, func(t *testing.T) {
			stray := strayDescriptor(t)
			a := newAgentGateway(t, p)

			// A text turn: the spec's chunks, a session, the scripted text.
			s := a.turn(t, "cohort-say: hello from the test")
			if s.Finish != "stop" || !strings.Contains(s.Text, "echo: hello from the test") || s.Session == nil {
				for _, turn := range a.model.Turns() {
					t.Logf("model turn: user %q tools %v results %q", turn.User, turn.Tools, turn.ToolResults)
				}
				t.Fatalf("text turn: finish %q text %q session %v error %v", s.Finish, s.Text, s.Session, s.Error)
			}
			session := s.Session.(string)
			// usage, from the agents that report it (the scripted model's
			// 11 + 2 tokens); null from the others.
			if u, _ := s.Usage.(map[string]any); reportsUsage[p.Name] != (u != nil) || u != nil && fmt.Sprintf("%v %v %v", u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) != "11 2 13" {
				t.Fatalf("usage %v", s.Usage)
			}
			// The model got the real key from the vault; the agent held a
			// placeholder.
			keys := a.script.sawKeys()
			if len(keys) == 0 || keys[len(keys)-1] != a.key {
				t.Fatalf("the model saw keys %v, want the vault's", keys)
			}

			// manual: the agent's permission request is one
			// service.provide_input call; allow_once runs the command and
			// the same run finishes with its output.
			s = a.turn(t, "cohort-run: echo a > ran.txt && echo ran-4''2", `"approval_mode":"manual"`, `"session_id":`+jsonStr(session))
			if s.Finish != "tool_calls" || s.Args == nil {
				for _, turn := range a.model.Turns() {
					t.Logf("model turn: user %q tools %v results %q", turn.User, turn.Tools, turn.ToolResults)
				}
				t.Fatalf("manual: want a pause, got finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}
			kinds := optionKinds(t, s.Args)
			for _, k := range []string{"allow_once", "reject_once"} {
				if !kinds[k] {
					t.Fatalf("permission options %v lack %s", s.Args, k)
				}
			}
			s = readAll(t, chat(t, a.gw, a.c.WK, a.intern, s.answer("allow_once")))
			if s.Finish != "stop" || !strings.Contains(s.Text, "ran-42") {
				t.Fatalf("allow_once: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}

			// reject_once: the run goes on without running it.
			s = a.turn(t, "cohort-run: echo b > rejected.txt && echo rejected-4''2", `"approval_mode":"manual"`, `"session_id":`+jsonStr(session))
			if s.Finish != "tool_calls" {
				t.Fatalf("manual again: finish %q error %v", s.Finish, s.Error)
			}
			s = readAll(t, chat(t, a.gw, a.c.WK, a.intern, s.answer("reject_once")))
			switch {
			case strings.Contains(s.Text, "rejected-42"):
				t.Fatalf("reject_once ran the command: %q", s.Text)
			case rejectEndsTurn[p.Name]:
				// Codex aborts its turn on a rejection: the spec's run-ended
				// error, not a hang (docs/agents.md).
				if s.Finish != "error" || s.reason() != "410 run_ended" {
					t.Fatalf("reject_once: want 410 run_ended, got finish %q error %v", s.Finish, s.Error)
				}
			case s.Finish != "stop":
				t.Fatalf("reject_once: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}

			// self-drive answers for the caller.
			s = a.turn(t, "cohort-run: echo c > self.txt && echo self-4''2", `"approval_mode":"self-drive"`, `"session_id":`+jsonStr(session))
			if s.Finish != "stop" || !strings.Contains(s.Text, "self-42") {
				t.Fatalf("self-drive: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}

			// Descriptors: every process of the jail, while the agent's
			// own shell tool runs a command, in self-drive and in manual
			// after allow_once, holds 0-2 and what it opened itself.
			checkFDsDuring(t, a.gw.cmd.Process.Pid, p.Name+" self-drive", "sleep", stray, false, func() {
				a.turn(t, "cohort-run: sleep 3", `"approval_mode":"self-drive"`, `"session_id":`+jsonStr(session))
			})
			checkFDsDuring(t, a.gw.cmd.Process.Pid, p.Name+" manual, allow_once", "sleep", stray, false, func() {
				if s := a.turn(t, "cohort-run: sleep 3", `"approval_mode":"manual"`, `"session_id":`+jsonStr(session)); s.Finish == "tool_calls" {
					readAll(t, chat(t, a.gw, a.c.WK, a.intern, s.answer("allow_once")))
				}
			})

			// A later turn of the session carries its history to the model.
			s = a.turn(t, "cohort-say: second turn", `"session_id":`+jsonStr(session))
			history := false
			for _, turn := range a.model.Turns() {
				// Agents make side calls too (titles, summaries): the turn's
				// own request is the one with its prompt.
				if strings.Contains(turn.User, "cohort-say: second turn") && strings.Contains(string(turn.Body), "hello from the test") {
					history = true
				}
			}
			if s.Finish != "stop" || !strings.Contains(s.Text, "echo: second turn") || !history {
				t.Fatalf("second turn: finish %q text %q; history sent: %v", s.Finish, s.Text, history)
			}

			// The agent crashing mid-run (every agent runs from
			// node_modules; the bracket keeps the shell's own command line
			// from matching): the stream ends with the spec's error chunk
			// after the 200, and the next turn gets a new agent.
			s = a.turn(t, "cohort-run: pgrep -f node_module[s]/ | xargs kill -9; sleep 5; echo survived-4''2",
				`"approval_mode":"self-drive"`, `"session_id":`+jsonStr(session))
			if s.Finish != "error" || strings.Contains(s.Text, "survived-42") || !s.Done {
				t.Fatalf("crash: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}
			t.Logf("%s crash: %s", p.Name, s.reason())
			s = a.turn(t, "cohort-say: after the crash", `"session_id":`+jsonStr(session))
			if s.reason() == "502 turn_failed" {
				// Under load the first turn after a kill can still meet the
				// dying agent's leftovers (Gemini CLI's session files): a
				// spec-shaped failure, and the turn after it must work.
				t.Logf("%s: the first turn after the crash failed: %v", p.Name, s.Error)
				s = a.turn(t, "cohort-say: after the crash", `"session_id":`+jsonStr(session))
			}
			if s.Finish != "stop" || !strings.Contains(s.Text, "echo: after the crash") {
				t.Fatalf("after the crash: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}

			// cancel as the answer to a permission: the command does not
			// run and the stream ends in the spec's shape, not a hang.
			s = a.turn(t, "cohort-run: echo d > cancel.txt && echo cancelled-4''2", `"approval_mode":"manual"`, `"session_id":`+jsonStr(session))
			if s.Finish != "tool_calls" {
				t.Fatalf("manual for cancel: finish %q error %v", s.Finish, s.Error)
			}
			s = readAll(t, chat(t, a.gw, a.c.WK, a.intern, s.answer("cancel")))
			if strings.Contains(s.Text, "cancelled-42") || !s.Done || (s.Finish != "stop" && s.reason() != "410 run_ended") {
				t.Fatalf("cancel: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}

			// allow_always runs the command and, where the agent keeps the
			// rule, the same command later runs without asking.
			// Last of the manual rows: Gemini CLI and OpenCode keep the rule for
			// every echo.
			always := "cohort-run: echo e > always.txt && echo always-4''2"
			s = a.turn(t, always, `"approval_mode":"manual"`, `"session_id":`+jsonStr(session))
			if s.Finish != "tool_calls" || !optionKinds(t, s.Args)["allow_always"] {
				t.Fatalf("manual for allow_always: finish %q args %v error %v", s.Finish, s.Args, s.Error)
			}
			s = readAll(t, chat(t, a.gw, a.c.WK, a.intern, s.answer("allow_always")))
			if s.Finish != "stop" || !strings.Contains(s.Text, "always-42") {
				t.Fatalf("allow_always: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}
			s = a.turn(t, always, `"approval_mode":"manual"`, `"session_id":`+jsonStr(session))
			if remembersAlways[p.Name] != (s.Finish == "stop") {
				t.Fatalf("after allow_always, the same command: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}
			if s.Finish == "tool_calls" {
				s = readAll(t, chat(t, a.gw, a.c.WK, a.intern, s.answer("allow_once")))
			}
			if s.Finish != "stop" || !strings.Contains(s.Text, "always-42") {
				t.Fatalf("the same command again: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}

			// A question, where the agent asks through ACP elicitation
			// (Claude Code's AskUserQuestion): one service.provide_input
			// with the question's choices; the answer resumes the run and
			// reaches the model.
			if asksByElicitation[p.Name] {
				s = a.turn(t, "cohort-ask: Which color?", `"session_id":`+jsonStr(session))
				var q struct {
					Kind    string
					Message string
					Fields  []struct {
						Name    string
						Options []string
					}
				}
				args, _ := s.ToolCall["function"].(map[string]any)["arguments"].(string)
				json.Unmarshal([]byte(args), &q)
				if s.Finish != "tool_calls" || q.Kind != "elicitation" || q.Message != "Which color?" || len(q.Fields) == 0 || !slices.Equal(q.Fields[0].Options, []string{"red", "blue"}) {
					t.Fatalf("question: finish %q tool call %v error %v", s.Finish, s.ToolCall, s.Error)
				}
				s = readAll(t, chat(t, a.gw, a.c.WK, a.intern, s.answer(`{"action":"accept","content":{"`+q.Fields[0].Name+`":"blue"}}`)))
				if s.Finish != "stop" || !strings.Contains(s.Text, "tool said:") || !strings.Contains(s.Text, "blue") {
					t.Fatalf("answered question: finish %q text %q error %v", s.Finish, s.Text, s.Error)
				}
			}

			// http_request through the daemon's MCP server with the bound
			// secret: the bound host gets the value, the model and the
			// caller only the placeholder.
			s = a.turn(t, "cohort-http: /with-secret", `"approval_mode":"self-drive"`, `"session_id":`+jsonStr(session))
			if s.Finish != "stop" || !strings.Contains(s.Text, "target answered /with-secret") || strings.Contains(s.Text, a.secret) {
				t.Fatalf("http_request: finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}
			if got := a.target.Auth(); len(got) != 1 || got[0] != "Bearer "+a.secret {
				t.Fatalf("the bound host got Authorization %q", got)
			}
			for _, turn := range a.model.Turns() {
				if strings.Contains(string(turn.Body), a.secret) {
					t.Fatalf("the model was sent the secret's value")
				}
			}

			// The caller disconnects mid-run (the model's text is out, the
			// command still runs): the run is cancelled, so the session
			// takes a new turn, and nothing of the old one reaches it.
			ctx, hangUp := context.WithCancel(context.Background())
			ds := open(t, chatCtx(t, ctx, a.gw, a.c.WK, a.intern, user("cohort-announce: sleep 3; echo late-4''2",
				`"approval_mode":"self-drive"`, `"session_id":"disconnected"`)))
			ds.until(func(s *stream) bool { return strings.Contains(s.Text, "running it") })
			hangUp()
			other := "disconnected"
			testutil.Eventually(t, wait, p.Name+" takes a turn after the disconnect", func() bool {
				res := chat(t, a.gw, a.c.WK, a.intern, user("cohort-say: after the disconnect", `"session_id":`+jsonStr(other)))
				if res.StatusCode == http.StatusConflict {
					refusal(t, res, http.StatusConflict, "busy")
					return false
				}
				s = readAll(t, res)
				if s.Finish != "stop" || !strings.Contains(s.Text, "echo: after the disconnect") || strings.Contains(s.Text, "late-42") {
					t.Fatalf("after the disconnect: finish %q text %q error %v", s.Finish, s.Text, s.Error)
				}
				return true
			})

			// The jail restarted (suspend, resume): the session goes on, its
			// history loaded by the agent (session/load).
			// Resume waits for the stop: resumed before the gateway looked,
			// the jail would rightly go on as it was.
			stopped := `"msg":"intern daemon stopped","intern":"` + a.intern + `"`
			before := strings.Count(a.gw.stderr.String(), stopped)
			connectCall(t, a.gw, a.c.WK, "SuspendIntern", `{"id":"`+a.intern+`"}`)
			testutil.Eventually(t, wait, p.Name+" stops", func() bool { return strings.Count(a.gw.stderr.String(), stopped) > before })
			connectCall(t, a.gw, a.c.WK, "ResumeIntern", `{"id":"`+a.intern+`"}`)
			var res *http.Response
			var refused string
			testutil.Eventually(t, wait, p.Name+" runs again", func() bool {
				res = chat(t, a.gw, a.c.WK, a.intern, user("cohort-say: after the restart", `"session_id":`+jsonStr(session)))
				if res.StatusCode != 200 {
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					if refused != string(b) {
						refused = string(b)
						t.Logf("%s after the restart: %d %s", p.Name, res.StatusCode, b)
					}
					if res.StatusCode == http.StatusTooManyRequests {
						time.Sleep(time.Second) // the turn rate limit
					}
					return false
				}
				return true
			})
			s = readAll(t, res)
			history = false
			for _, turn := range a.model.Turns() {
				if strings.Contains(turn.User, "cohort-say: after the restart") && strings.Contains(string(turn.Body), "hello from the test") {
					history = true
				}
			}
			if s.Finish != "stop" || !strings.Contains(s.Text, "echo: after the restart") || history != keepsHistory[p.Name] {
				t.Fatalf("after the restart: finish %q text %q error %v; history sent: %v", s.Finish, s.Text, s.Error, history)
			}
		})
	}
}

// optionKinds reads the option kinds of a permission pause.
func optionKinds(t *testing.T, args map[string]any) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	opts, _ := args["options"].([]any)
	for _, o := range opts {
		if k, ok := o.(string); ok {
			out[k] = true
		}
	}
	return out
}

// TestThirdPartyAgentsUnjailed runs every known agent under an unjailed
// `cohort intern` (the remote provisioner's daemon), whose agent gets its
// environment from the allowlist plus its profile's settings: that is
// enough for each to answer a turn. The operator's other variables do not
// reach it (the model sees the key the daemon was given, not the shell's).
func TestThirdPartyAgentsUnjailed(t *testing.T) {
	c, gw := newCluster(t, "", "--first-event-timeout", agentFirstEvent)
	for _, p := range agents.All() {
		t.Run(p.Name, func(t *testing.T) {
			modules := requireAgent(t, p)
			s := &script{agent: p.Name}
			model := modelserver.Start(t, s.reply)
			key := randomCanary("provider-key")
			d := c.Daemon(t, c.NewIntern(t, p.Name), []string{"AWS_SECRET_ACCESS_KEY=e2e-aws", "OPENAI_API_KEY=e2e-shell-key"},
				"--agent", p.Name, "--agent-modules", modules, "--agent-base-url", "http://"+model.Addr, "--agent-key-placeholder", key)
			res := readAll(t, chat(t, gw, c.WK, d.id, user("cohort-say: hello unjailed")))
			if res.Finish != "stop" || !strings.Contains(res.Text, "echo: hello unjailed") {
				t.Fatalf("text turn: finish %q text %q error %v", res.Finish, res.Text, res.Error)
			}
			if keys := s.sawKeys(); len(keys) == 0 || keys[len(keys)-1] != key {
				t.Fatalf("the model saw keys %v, want the daemon's", keys)
			}
		})
	}
}
