package builtinagent_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/cohort-dev/cohort/internal/builtinagent"
	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
	"github.com/cohort-dev/cohort/internal/builtinagent/sandbox"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

func TestMain(m *testing.M) {
	// The SDK's connection diagnostics ("connection closed") go to slog's
	// default logger.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}

// harness is a real agent on in-process pipes with the SDK's client side.
type harness struct {
	conn    *acp.ClientSideConnection
	client  *agenttest.Client
	session acp.SessionId
	dir     string
	logs    *testutil.SyncBuffer
}

func start(t testing.TB, cfg builtinagent.Config, newSessionMeta map[string]any) *harness {
	t.Helper()
	return startReading(t, cfg, newSessionMeta, nil)
}

// startReading is start with the client reading the agent's output
// through read (as the intern daemon reads it through its tap), when set.
func startReading(t testing.TB, cfg builtinagent.Config, newSessionMeta map[string]any, read func(io.Reader) io.Reader) *harness {
	t.Helper()
	logs := &testutil.SyncBuffer{}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	agentIn, clientOut := io.Pipe()
	clientIn, agentOut := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = builtinagent.Serve(ctx, cfg, agentIn, agentOut)
	}()
	t.Cleanup(func() {
		cancel()
		clientOut.Close()
		agentOut.Close()
		<-done
	})
	c := &agenttest.Client{}
	var out io.Reader = clientIn
	if read != nil {
		out = read(clientIn)
	}
	conn := acp.NewClientSideConnection(c, clientOut, out)
	h := &harness{conn: conn, client: c, logs: logs}
	if _, err := conn.Initialize(context.Background(), agenttest.Initialize()); err != nil {
		t.Fatal(err)
	}
	h.dir = t.TempDir()
	s, err := conn.NewSession(context.Background(), acp.NewSessionRequest{Cwd: h.dir, McpServers: []acp.McpServer{}, Meta: newSessionMeta})
	if err != nil {
		t.Fatal(err)
	}
	h.session = s.SessionId
	return h
}

func (h *harness) prompt(t testing.TB, text, mode string) (acp.PromptResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var meta map[string]any
	if mode != "" {
		meta = map[string]any{builtinagent.MetaApprovalMode: mode}
	}
	return h.conn.Prompt(ctx, acp.PromptRequest{SessionId: h.session, Prompt: []acp.ContentBlock{acp.TextBlock(text)}, Meta: meta})
}

func (h *harness) mustPrompt(t testing.TB, text, mode string) acp.PromptResponse {
	t.Helper()
	resp, err := h.prompt(t, text, mode)
	if err != nil {
		t.Fatalf("prompt %q: %v", text, err)
	}
	return resp
}

// modelsSeen returns the distinct `_meta["cohort.dev/model"]` values, and
// fails when an update carries none.
func modelsSeen(t *testing.T, ups []acp.SessionNotification) []string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	for _, u := range ups {
		m, ok := u.Meta[builtinagent.MetaModel].(string)
		if !ok || m == "" {
			t.Fatalf("session/update without %s: %+v", builtinagent.MetaModel, u)
		}
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	return out
}

func TestInitializeIsHonest(t *testing.T) {
	for _, c := range []struct {
		name     string
		stateDir string
		load     bool
	}{{"without state dir", "", false}, {"with state dir", t.TempDir(), true}} {
		t.Run(c.name, func(t *testing.T) {
			agentIn, clientOut := io.Pipe()
			clientIn, agentOut := io.Pipe()
			go builtinagent.Serve(context.Background(), builtinagent.Config{StateDir: c.stateDir}, agentIn, agentOut)
			defer clientOut.Close()
			conn := acp.NewClientSideConnection(&agenttest.Client{}, clientOut, clientIn)
			resp, err := conn.Initialize(context.Background(), agenttest.Initialize())
			if err != nil {
				t.Fatal(err)
			}
			caps := resp.AgentCapabilities
			if resp.ProtocolVersion != acp.ProtocolVersionNumber || caps.LoadSession != c.load ||
				caps.PromptCapabilities.Image || caps.PromptCapabilities.Audio || caps.PromptCapabilities.EmbeddedContext ||
				!caps.McpCapabilities.Http || caps.McpCapabilities.Sse || resp.AgentInfo == nil || resp.AgentInfo.Name != "cohort-agent" {
				t.Fatalf("%+v", resp)
			}
			if !c.load {
				_, err := conn.LoadSession(context.Background(), acp.LoadSessionRequest{SessionId: "sess_x", Cwd: "/", McpServers: []acp.McpServer{}})
				var re *acp.RequestError
				if !errors.As(err, &re) || re.Code != -32601 {
					t.Fatalf("load without state dir: %v", err)
				}
			}
		})
	}
}

func TestDemoAnswer(t *testing.T) {
	h := start(t, builtinagent.Config{}, nil)
	resp := h.mustPrompt(t, "hello there", builtinagent.ModeManual)
	if resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("stop %q", resp.StopReason)
	}
	if got := h.client.Text(); got != "Hello from cohort/demo. You said: hello there" {
		t.Fatalf("text %q", got)
	}
	var thoughts, texts int
	for _, u := range h.client.Updates() {
		if u.Update.AgentThoughtChunk != nil {
			thoughts++
		}
		if u.Update.AgentMessageChunk != nil {
			texts++
		}
	}
	if thoughts < 2 || texts < 2 || h.client.Thought() == "" {
		t.Fatalf("%d thought chunks, %d text chunks", thoughts, texts)
	}
	if got := modelsSeen(t, h.client.Updates()); len(got) != 1 || got[0] != builtinagent.DemoModelID {
		t.Fatalf("models %v", got)
	}
	u := resp.Usage
	if u == nil || u.InputTokens <= 0 || u.OutputTokens <= 0 || u.TotalTokens != u.InputTokens+u.OutputTokens {
		t.Fatalf("usage %+v", u)
	}
	if _, ok := resp.Meta[builtinagent.MetaCost]; ok {
		t.Fatal("the demo model reported a cost")
	}
	// Deterministic: the same prompt in a new session gives the same stream.
	h2 := start(t, builtinagent.Config{}, nil)
	resp2 := h2.mustPrompt(t, "hello there", builtinagent.ModeManual)
	if h2.client.Text() != h.client.Text() || h2.client.Thought() != h.client.Thought() || *resp2.Usage != *resp.Usage {
		t.Fatal("the demo model is not deterministic")
	}
}

func needSandbox(t *testing.T) {
	t.Helper()
	if !sandbox.Available() {
		t.Skip("SKIPPING: this machine cannot make namespaces; the manual-mode sandbox is untested")
	}
}

func TestDemoShellManualAllowOnceIsSandboxed(t *testing.T) {
	needSandbox(t)
	h := start(t, builtinagent.Config{}, nil)
	h.client.OnPermission = agenttest.Select(builtinagent.OptionAllowOnce)
	outside := t.TempDir()
	resp := h.mustPrompt(t, "$ echo hi > /tmp/f && cat /tmp/f && (touch f 2>/dev/null || echo ro) && tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' && touch "+outside+"/x", builtinagent.ModeManual)
	if resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("stop %q", resp.StopReason)
	}
	perms := h.client.Permissions()
	if len(perms) != 1 {
		t.Fatalf("%d permission requests", len(perms))
	}
	p := perms[0]
	var ids, kinds []string
	for _, o := range p.Options {
		ids = append(ids, string(o.OptionId))
		kinds = append(kinds, string(o.Kind))
	}
	want := "allow_once,allow_always,reject_once,reject_always"
	if strings.Join(ids, ",") != want || strings.Join(kinds, ",") != want {
		t.Fatalf("options %v %v", ids, kinds)
	}
	if p.ToolCall.Title == nil || *p.ToolCall.Title != "shell" || p.Meta[builtinagent.MetaTool] != "shell" || p.SessionId != h.session {
		t.Fatalf("permission request %+v", p)
	}
	text := h.client.Text()
	// The command wrote only its private /tmp (the work dir is read-only
	// until escalation), saw only loopback, and could not write outside.
	if !strings.Contains(text, `"output":"hi\nro\nlo\n`) || !strings.Contains(text, `"sandboxed":true`) {
		t.Fatalf("text %q", text)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "f")); err == nil {
		t.Fatal("the sandboxed command wrote its work dir")
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
		t.Fatal("sandboxed command wrote outside the work dir")
	}
	// allow_once is not remembered: the next command asks again.
	h.mustPrompt(t, "$ true", builtinagent.ModeManual)
	if n := len(h.client.Permissions()); n != 2 {
		t.Fatalf("%d permission requests after a second command", n)
	}
}

func TestDemoShellManualGrants(t *testing.T) {
	needSandbox(t)
	cases := []struct {
		name       string
		option     string
		wantFirst  string // in the first answer
		wantSecond string // in the second answer, which must not ask
		askAgain   bool
	}{
		{"allow_always lifts the sandbox for the session", builtinagent.OptionAllowAlways, `"sandboxed":false`, `"sandboxed":false`, false},
		{"reject_once refuses once", builtinagent.OptionRejectOnce, "the user rejected this command", "the user rejected this command", true},
		{"reject_always refuses for the session", builtinagent.OptionRejectAlways, "any further shell command", "refused shell commands for the rest of this session", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := start(t, builtinagent.Config{}, nil)
			h.client.OnPermission = agenttest.Select(c.option)
			h.mustPrompt(t, "$ echo one > one", builtinagent.ModeManual)
			if !strings.Contains(h.client.Text(), c.wantFirst) {
				t.Fatalf("first answer %q", h.client.Text())
			}
			h.client.Reset()
			h.mustPrompt(t, "$ echo two > two", builtinagent.ModeManual)
			if !strings.Contains(h.client.Text(), c.wantSecond) {
				t.Fatalf("second answer %q", h.client.Text())
			}
			if asked := len(h.client.Permissions()) == 1; asked != c.askAgain {
				t.Fatalf("asked again: %v", asked)
			}
			_, errOne := os.Stat(filepath.Join(h.dir, "one"))
			if ran := errOne == nil; ran != (c.option == builtinagent.OptionAllowAlways) {
				t.Fatalf("first command ran: %v", ran)
			}
		})
	}
}

func TestDemoShellSelfDriveUnsandboxedAndScrubbed(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-must-not-leak")
	h := start(t, builtinagent.Config{}, nil)
	outside := t.TempDir()
	h.mustPrompt(t, "$ echo key=$OPENAI_API_KEY && touch "+outside+"/x", builtinagent.ModeSelfDrive)
	if len(h.client.Permissions()) != 0 {
		t.Fatal("self-drive asked for permission")
	}
	text := h.client.Text()
	if !strings.Contains(text, `key=\n`) || !strings.Contains(text, `"sandboxed":false`) || strings.Contains(text, "sk-must-not-leak") {
		t.Fatalf("text %q", text)
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err != nil {
		t.Fatal("self-drive command was confined")
	}
}

func TestApprovalModeSignalling(t *testing.T) {
	needSandbox(t)
	t.Run("session default applies to prompts without a mode", func(t *testing.T) {
		h := start(t, builtinagent.Config{}, map[string]any{builtinagent.MetaApprovalMode: builtinagent.ModeSelfDrive})
		h.mustPrompt(t, "$ true", "")
		if len(h.client.Permissions()) != 0 {
			t.Fatal("asked under a self-drive session default")
		}
		h.client.OnPermission = agenttest.Select(builtinagent.OptionRejectOnce)
		h.mustPrompt(t, "$ true", builtinagent.ModeManual)
		if len(h.client.Permissions()) != 1 {
			t.Fatal("a manual prompt did not ask")
		}
	})
	t.Run("manual when nothing says otherwise", func(t *testing.T) {
		h := start(t, builtinagent.Config{}, nil)
		h.client.OnPermission = agenttest.Select(builtinagent.OptionRejectOnce)
		h.mustPrompt(t, "$ true", "")
		if len(h.client.Permissions()) != 1 {
			t.Fatal("did not ask")
		}
	})
	t.Run("unknown mode refused", func(t *testing.T) {
		h := start(t, builtinagent.Config{}, nil)
		_, err := h.prompt(t, "$ true", "yolo")
		var re *acp.RequestError
		if !errors.As(err, &re) || re.Code != -32602 || !strings.Contains(re.Error(), "approval_mode") {
			t.Fatalf("err %v", err)
		}
		agentIn := h.client.Updates()
		if len(agentIn) != 0 {
			t.Fatal("a refused prompt streamed updates")
		}
	})
}

func TestDemoQuestion(t *testing.T) {
	cases := []struct {
		name  string
		reply acp.UnstableCreateElicitationResponse
		want  string
	}{
		{"accept", acp.UnstableCreateElicitationResponse{Accept: &acp.UnstableCreateElicitationAccept{Action: "accept", Content: map[string]any{"answer": "forty-two"}}}, "Thanks. You answered: forty-two"},
		{"decline", acp.NewUnstableCreateElicitationResponseDecline(), "You declined to answer, so I will not guess."},
		{"cancel", acp.NewUnstableCreateElicitationResponseCancel(), "You dismissed the question; I stop here."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := start(t, builtinagent.Config{}, nil)
			h.client.OnElicit = func(context.Context, acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error) {
				return c.reply, nil
			}
			resp := h.mustPrompt(t, "what is the answer?", builtinagent.ModeManual)
			if resp.StopReason != acp.StopReasonEndTurn || h.client.Text() != c.want {
				t.Fatalf("stop %q text %q", resp.StopReason, h.client.Text())
			}
			el := h.client.Elicitations()
			if len(el) != 1 || el[0].Form == nil {
				t.Fatalf("elicitations %+v", el)
			}
			f := el[0].Form
			if f.Meta[builtinagent.MetaSessionID] != string(h.session) || f.Meta[builtinagent.MetaToolCallID] == "" || !strings.Contains(f.Message, "what is the answer?") {
				t.Fatalf("form %+v", f)
			}
			prop, _ := f.RequestedSchema.Properties["answer"].(map[string]any)
			if prop["type"] != "string" || len(f.RequestedSchema.Required) != 1 || f.RequestedSchema.Required[0] != "answer" {
				t.Fatalf("schema %+v", f.RequestedSchema)
			}
		})
	}
}

// A scripted upstream: streamed text and reasoning (both field names), a
// tool call whose arguments arrive in pieces, usage summed over the turn's
// calls, the upstream's model id on every update, the API key only in the
// Authorization header.
func TestUpstreamTurn(t *testing.T) {
	const m = "upstream/model-x-2026"
	const key = "sk-test-secret-123"
	up := agenttest.NewUpstream(t,
		agenttest.Step{Chunks: []string{
			agenttest.Reasoning(m, "reasoning", "I should "),
			agenttest.Reasoning(m, "reasoning_content", "look."),
			agenttest.Text(m, "Let me check. "),
			agenttest.ToolCallStart(m, 0, "call_1", "shell", `{"comm`),
			agenttest.ToolCallArgs(m, 0, `and":"echo hi"}`),
			agenttest.Finish(m, "tool_calls"),
			agenttest.Usage(m, 100, 20, 40, 0.001),
		}},
		agenttest.Step{Chunks: []string{
			agenttest.Text(m, "It said "),
			agenttest.Text(m, "hi."),
			agenttest.Finish(m, "stop"),
			agenttest.Usage(m, 150, 5, 60, 0.0025),
		}},
	)
	h := start(t, builtinagent.Config{Model: "configured-model", BaseURL: up.BaseURL(), APIKey: key}, nil)
	resp := h.mustPrompt(t, "say hi", builtinagent.ModeSelfDrive)
	if resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("stop %q", resp.StopReason)
	}
	if got := h.client.Text(); got != "Let me check. It said hi." {
		t.Fatalf("text %q", got)
	}
	if got := h.client.Thought(); got != "I should look." {
		t.Fatalf("thought %q", got)
	}
	if got := modelsSeen(t, h.client.Updates()); len(got) != 1 || got[0] != m {
		t.Fatalf("models %v", got)
	}
	u := resp.Usage
	if u == nil || u.InputTokens != 250 || u.OutputTokens != 25 || u.TotalTokens != 275 || u.CachedReadTokens == nil || *u.CachedReadTokens != 100 {
		t.Fatalf("usage %+v", u)
	}
	if cost, _ := resp.Meta[builtinagent.MetaCost].(float64); cost < 0.00349 || cost > 0.00351 {
		t.Fatalf("cost %v", resp.Meta[builtinagent.MetaCost])
	}
	if resp.Meta[builtinagent.MetaModel] != m {
		t.Fatalf("meta %v", resp.Meta)
	}
	reqs := up.Requests()
	if len(reqs) != 2 || reqs[0]["model"] != "configured-model" || reqs[0]["stream"] != true {
		t.Fatalf("requests %v", reqs)
	}
	if so, _ := reqs[0]["stream_options"].(map[string]any); so["include_usage"] != true {
		t.Fatalf("stream_options %v", reqs[0]["stream_options"])
	}
	tool := lastMessage(t, reqs[1])
	if tool["role"] != "tool" || tool["tool_call_id"] != "call_1" || !strings.Contains(tool["content"].(string), `"output":"hi\n"`) {
		t.Fatalf("tool message %v", tool)
	}
	for _, a := range up.Authorizations() {
		if a != "Bearer "+key {
			t.Fatalf("authorization %q", a)
		}
	}
	if strings.Contains(h.logs.String(), key) {
		t.Fatal("the API key reached the log")
	}
	if !strings.Contains(h.logs.String(), "turn ended") {
		t.Fatalf("no turn log: %s", h.logs.String())
	}
}

func lastMessage(t *testing.T, req map[string]any) map[string]any {
	t.Helper()
	msgs, _ := req["messages"].([]any)
	if len(msgs) == 0 {
		t.Fatalf("no messages in %v", req)
	}
	m, _ := msgs[len(msgs)-1].(map[string]any)
	return m
}

func TestUpstreamNoUsage(t *testing.T) {
	const m = "m"
	up := agenttest.NewUpstream(t, agenttest.Step{Chunks: []string{agenttest.Text(m, "ok"), agenttest.Finish(m, "stop")}})
	h := start(t, builtinagent.Config{Model: m, BaseURL: up.BaseURL()}, nil)
	resp := h.mustPrompt(t, "hi", builtinagent.ModeManual)
	if resp.Usage != nil || resp.Meta[builtinagent.MetaCost] != nil {
		t.Fatalf("usage %+v meta %v", resp.Usage, resp.Meta)
	}
}

func TestUpstreamFailures(t *testing.T) {
	const m = "m"
	cases := []struct {
		name    string
		step    agenttest.Step
		reason  string
		message string
	}{
		{"500", agenttest.Step{Status: 500, ErrorMessage: "the model is on fire"}, "turn_failed", "model upstream returned HTTP 500: the model is on fire"},
		{"hang", agenttest.Step{Chunks: []string{agenttest.Text(m, "thinking…")}, Hang: true}, "timeout", "model upstream timed out"},
		{"hang before headers", agenttest.Step{Hang: true}, "timeout", "model upstream timed out"},
		{"connection dropped mid-stream", agenttest.Step{Chunks: []string{agenttest.Text(m, "par")}, CloseMidStream: true}, "turn_failed", "model upstream closed the stream before the answer finished"},
		{"body ended without finish", agenttest.Step{Chunks: []string{agenttest.Text(m, "par")}, EndWithoutDone: true}, "turn_failed", "model upstream closed the stream before the answer finished"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := agenttest.NewUpstream(t, c.step, agenttest.Answer(m, 1, 1, "recovered"))
			h := start(t, builtinagent.Config{Model: m, BaseURL: up.BaseURL(), APIKey: "sk-x", IdleTimeout: 300 * time.Millisecond}, nil)
			_, err := h.prompt(t, "hi", builtinagent.ModeManual)
			var re *acp.RequestError
			if !errors.As(err, &re) {
				t.Fatalf("err %v", err)
			}
			data, _ := re.Data.(map[string]any)
			if re.Code != -32603 || !strings.HasPrefix(re.Message, c.message) || data["reason"] != c.reason {
				t.Fatalf("error %+v", re)
			}
			// The session survives: the next prompt works.
			h.client.Reset()
			if resp := h.mustPrompt(t, "again", builtinagent.ModeManual); resp.StopReason != acp.StopReasonEndTurn || h.client.Text() != "recovered" {
				t.Fatalf("after failure: %q %q", resp.StopReason, h.client.Text())
			}
		})
	}
}

func TestCancelMidStream(t *testing.T) {
	const m = "m"
	up := agenttest.NewUpstream(t, agenttest.Step{Chunks: []string{agenttest.Text(m, "partial ")}, Hang: true}, agenttest.Answer(m, 1, 1, "next"))
	h := start(t, builtinagent.Config{Model: m, BaseURL: up.BaseURL(), IdleTimeout: time.Minute}, nil)
	go func() {
		for h.client.Text() == "" {
			time.Sleep(5 * time.Millisecond)
		}
		_ = h.conn.Cancel(context.Background(), acp.CancelNotification{SessionId: h.session})
	}()
	began := time.Now()
	resp := h.mustPrompt(t, "hi", builtinagent.ModeManual)
	if resp.StopReason != acp.StopReasonCancelled || time.Since(began) > 10*time.Second {
		t.Fatalf("stop %q after %v", resp.StopReason, time.Since(began))
	}
	// What the user saw stays in the conversation.
	h.mustPrompt(t, "go on", builtinagent.ModeManual)
	msgs, _ := up.Requests()[1]["messages"].([]any)
	if b, _ := json.Marshal(msgs); !strings.Contains(string(b), `"content":"partial "`) {
		t.Fatalf("history %s", b)
	}
}

func TestMalformedToolArguments(t *testing.T) {
	const m = "m"
	cases := []struct{ name, tool, args, want string }{
		{"not JSON", "shell", `{"command": "ls`, "invalid arguments for shell"},
		{"wrong key", "shell", `{"cmd": "ls"}`, `unknown field "cmd"`},
		{"empty command", "shell", `{"command": ""}`, `"command" is empty`},
		{"question without message", "ask_user", `{}`, `"message" is empty`},
		{"bad field type", "ask_user", `{"message":"q","fields":[{"name":"a","type":"date"}]}`, "type must be string"},
		{"unknown tool", "rm_rf", `{}`, `unknown tool "rm_rf"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := agenttest.NewUpstream(t, agenttest.Call(m, "call_bad", c.tool, c.args), agenttest.Answer(m, 1, 1, "sorry"))
			h := start(t, builtinagent.Config{Model: m, BaseURL: up.BaseURL()}, nil)
			resp := h.mustPrompt(t, "do it", builtinagent.ModeSelfDrive)
			if resp.StopReason != acp.StopReasonEndTurn || h.client.Text() != "sorry" {
				t.Fatalf("stop %q text %q", resp.StopReason, h.client.Text())
			}
			tool := lastMessage(t, up.Requests()[1])
			content, _ := tool["content"].(string)
			var result struct{ Error string }
			_ = json.Unmarshal([]byte(content), &result)
			if tool["role"] != "tool" || tool["tool_call_id"] != "call_bad" || !strings.Contains(result.Error, c.want) {
				t.Fatalf("tool message %v", tool)
			}
			if len(h.client.Permissions())+len(h.client.Elicitations()) != 0 {
				t.Fatal("a malformed call reached the client")
			}
		})
	}
}

func TestCancelDuringPermissionWait(t *testing.T) {
	const m = "m"
	up := agenttest.NewUpstream(t, agenttest.Call(m, "call_1", "shell", `{"command":"touch ran"}`), agenttest.Answer(m, 1, 1, "fresh"))
	h := start(t, builtinagent.Config{Model: m, BaseURL: up.BaseURL()}, nil)
	asked := make(chan struct{})
	released := make(chan struct{})
	h.client.OnPermission = func(ctx context.Context, p acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		close(asked)
		<-ctx.Done() // the agent's cancellation reaches the waiting request
		close(released)
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeCancelled()}, nil
	}
	go func() {
		<-asked
		_ = h.conn.Cancel(context.Background(), acp.CancelNotification{SessionId: h.session})
	}()
	resp := h.mustPrompt(t, "touch it", builtinagent.ModeManual)
	if resp.StopReason != acp.StopReasonCancelled {
		t.Fatalf("stop %q", resp.StopReason)
	}
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("the permission request was not cancelled")
	}
	if _, err := os.Stat(filepath.Join(h.dir, "ran")); err == nil {
		t.Fatal("the command ran after a cancelled permission")
	}
	// The next turn sends a valid conversation: the unanswered call has a result.
	h.mustPrompt(t, "again", builtinagent.ModeManual)
	msgs, _ := up.Requests()[1]["messages"].([]any)
	b, _ := json.Marshal(msgs)
	if !strings.Contains(string(b), `"tool_call_id":"call_1"`) || !strings.Contains(string(b), "cancelled before this tool ran") {
		t.Fatalf("history %s", b)
	}
}

func TestPermissionCancelledOutcomeEndsTurn(t *testing.T) {
	h := start(t, builtinagent.Config{}, nil) // OnPermission nil answers "cancelled"
	resp := h.mustPrompt(t, "$ touch ran", builtinagent.ModeManual)
	if resp.StopReason != acp.StopReasonCancelled {
		t.Fatalf("stop %q", resp.StopReason)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "ran")); err == nil {
		t.Fatal("ran")
	}
}

func TestModelSelection(t *testing.T) {
	up := agenttest.NewUpstream(t, agenttest.Answer("served", 1, 1, "a"), agenttest.Answer("served", 1, 1, "b"), agenttest.Answer("served", 1, 1, "c"))
	h := start(t, builtinagent.Config{Model: "default-model", BaseURL: up.BaseURL()}, map[string]any{builtinagent.MetaModel: "from-meta"})
	h.mustPrompt(t, "1", builtinagent.ModeManual)
	if _, err := h.conn.SetSessionConfigOption(context.Background(), acp.SetSessionConfigOptionRequest{ValueId: &acp.SetSessionConfigOptionValueId{
		SessionId: h.session, ConfigId: builtinagent.ConfigModel, Value: "from-option"}}); err != nil {
		t.Fatal(err)
	}
	h.mustPrompt(t, "2", builtinagent.ModeManual)
	if _, err := h.conn.UnstableSetSessionModel(context.Background(), acp.UnstableSetSessionModelRequest{SessionId: h.session, ModelId: builtinagent.DemoModelID}); err != nil {
		t.Fatal(err)
	}
	h.client.Reset()
	h.mustPrompt(t, "3", builtinagent.ModeManual)
	reqs := up.Requests()
	if len(reqs) != 2 || reqs[0]["model"] != "from-meta" || reqs[1]["model"] != "from-option" {
		t.Fatalf("models asked: %v", reqs)
	}
	if got := modelsSeen(t, h.client.Updates()); len(got) != 1 || got[0] != builtinagent.DemoModelID {
		t.Fatalf("demo updates: %v", got)
	}
	_, err := h.conn.SetSessionConfigOption(context.Background(), acp.SetSessionConfigOptionRequest{ValueId: &acp.SetSessionConfigOptionValueId{
		SessionId: h.session, ConfigId: builtinagent.ConfigModel, Value: acp.SessionConfigValueId(strings.Repeat("m", 257))}})
	if err == nil {
		t.Fatal("a 257-character model id was accepted")
	}
}

func TestNewSessionAdvertisesModelOption(t *testing.T) {
	agentIn, clientOut := io.Pipe()
	clientIn, agentOut := io.Pipe()
	go builtinagent.Serve(context.Background(), builtinagent.Config{Model: "gpt-x"}, agentIn, agentOut)
	defer clientOut.Close()
	conn := acp.NewClientSideConnection(&agenttest.Client{}, clientOut, clientIn)
	if _, err := conn.Initialize(context.Background(), agenttest.Initialize()); err != nil {
		t.Fatal(err)
	}
	s, err := conn.NewSession(context.Background(), acp.NewSessionRequest{Cwd: t.TempDir(), McpServers: []acp.McpServer{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.ConfigOptions) != 1 || s.ConfigOptions[0].Select == nil {
		t.Fatalf("%+v", s.ConfigOptions)
	}
	o := s.ConfigOptions[0].Select
	if o.Id != builtinagent.ConfigModel || o.Category == nil || *o.Category != acp.SessionConfigOptionCategoryModel || o.CurrentValue != "gpt-x" ||
		s.Models == nil || s.Models.CurrentModelId != "gpt-x" {
		t.Fatalf("%+v %+v", o, s.Models)
	}
}

func TestSessionLoad(t *testing.T) {
	// A state directory not made yet: the first save makes it.
	state := filepath.Join(t.TempDir(), "state", "agent")
	h := start(t, builtinagent.Config{StateDir: state}, nil)
	h.mustPrompt(t, "remember me", builtinagent.ModeManual)

	// A new agent process on the same state directory.
	h2 := start(t, builtinagent.Config{StateDir: state}, nil)
	h2.client.Reset()
	if _, err := h2.conn.LoadSession(context.Background(), acp.LoadSessionRequest{SessionId: h.session, Cwd: h.dir, McpServers: []acp.McpServer{}}); err != nil {
		t.Fatal(err)
	}
	var replay []string
	for _, u := range h2.client.Updates() {
		switch {
		case u.Update.UserMessageChunk != nil:
			replay = append(replay, "user:"+u.Update.UserMessageChunk.Content.Text.Text)
		case u.Update.AgentMessageChunk != nil:
			replay = append(replay, "agent:"+u.Update.AgentMessageChunk.Content.Text.Text)
		}
	}
	if strings.Join(replay, "|") != "user:remember me|agent:Hello from cohort/demo. You said: remember me" {
		t.Fatalf("replay %v", replay)
	}
	h2.session = h.session
	h2.client.Reset()
	h2.mustPrompt(t, "again", builtinagent.ModeManual)
	if !strings.HasSuffix(h2.client.Text(), "You said: again") {
		t.Fatalf("after load: %q", h2.client.Text())
	}

	// A load may change the model (the intern's model changed meanwhile).
	up := agenttest.NewUpstream(t, agenttest.Answer("served", 1, 1, "ok"))
	h3 := start(t, builtinagent.Config{StateDir: state, BaseURL: up.BaseURL()}, nil)
	res, err := h3.conn.LoadSession(context.Background(), acp.LoadSessionRequest{SessionId: h.session, Cwd: h.dir, McpServers: []acp.McpServer{},
		Meta: map[string]any{builtinagent.MetaModel: "new-model"}})
	if err != nil || res.Models == nil || res.Models.CurrentModelId != "new-model" {
		t.Fatalf("load with model: %+v %v", res, err)
	}
	h3.session = h.session
	h3.mustPrompt(t, "third", builtinagent.ModeManual)
	msgs, _ := up.Requests()[0]["messages"].([]any)
	if up.Requests()[0]["model"] != "new-model" || len(msgs) != 6 { // system + 2 turns of user/assistant + this prompt
		t.Fatalf("request after load: %v", up.Requests()[0])
	}
	for _, bad := range []acp.SessionId{"sess_0123", "../../etc/passwd", "sess_00000000000000000000000000000000"} {
		_, err := h2.conn.LoadSession(context.Background(), acp.LoadSessionRequest{SessionId: bad, Cwd: h.dir, McpServers: []acp.McpServer{}})
		var re *acp.RequestError
		if !errors.As(err, &re) || re.Code != -32002 {
			t.Fatalf("load %q: %v", bad, err)
		}
	}
}

func TestUnknownSession(t *testing.T) {
	h := start(t, builtinagent.Config{}, nil)
	_, err := h.conn.Prompt(context.Background(), acp.PromptRequest{SessionId: "sess_nope", Prompt: []acp.ContentBlock{acp.TextBlock("hi")}})
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Code != -32602 {
		t.Fatalf("err %v", err)
	}
}

// The shell's bounds reach the model: a truncation note with the total size,
// and a timeout that killed the command.
func TestShellBoundsReachModel(t *testing.T) {
	const m = "m"
	cases := []struct {
		name, command string
		check         func(r map[string]any) bool
	}{
		{"output at the bound", "head -c 100 /dev/zero | tr '\\0' a", func(r map[string]any) bool {
			return len(r["output"].(string)) == 100 && r["output_truncated"] == nil
		}},
		{"output past the bound", "head -c 101 /dev/zero | tr '\\0' a", func(r map[string]any) bool {
			return len(r["output"].(string)) == 100 && r["output_truncated"] == "only the first 100 of 101 bytes are shown"
		}},
		{"timeout", "echo started; sleep 30", func(r map[string]any) bool {
			s, _ := r["timed_out"].(string)
			return r["output"] == "started\n" && strings.HasPrefix(s, "the command was killed after") && r["exit_code"] == float64(-1)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args, _ := json.Marshal(map[string]string{"command": c.command})
			up := agenttest.NewUpstream(t, agenttest.Call(m, "call_1", "shell", string(args)), agenttest.Answer(m, 1, 1, "ok"))
			h := start(t, builtinagent.Config{Model: m, BaseURL: up.BaseURL(), MaxToolOutput: 100, ShellTimeout: 300 * time.Millisecond}, nil)
			h.mustPrompt(t, "run", builtinagent.ModeSelfDrive)
			content, _ := lastMessage(t, up.Requests()[1])["content"].(string)
			var r map[string]any
			if err := json.Unmarshal([]byte(content), &r); err != nil || !c.check(r) {
				t.Fatalf("tool result %s (%v)", content, err)
			}
		})
	}
}

func TestUpstreamErrorRedactsKey(t *testing.T) {
	const key = "sk-echoed-by-a-bad-proxy"
	up := agenttest.NewUpstream(t, agenttest.Step{Status: 401, ErrorMessage: "invalid key " + key})
	h := start(t, builtinagent.Config{Model: "m", BaseURL: up.BaseURL(), APIKey: key}, nil)
	_, err := h.prompt(t, "hi", builtinagent.ModeManual)
	if err == nil || strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "HTTP 401: invalid key [redacted]") {
		t.Fatalf("err %v", err)
	}
	if strings.Contains(h.logs.String(), key) {
		t.Fatal("the key reached the log")
	}
}

func TestPromptResourceLink(t *testing.T) {
	h := start(t, builtinagent.Config{}, nil)
	resp, err := h.conn.Prompt(context.Background(), acp.PromptRequest{SessionId: h.session, Prompt: []acp.ContentBlock{
		acp.TextBlock("look at"), acp.ResourceLinkBlock("notes", "file:///notes.txt"),
	}})
	if err != nil || resp.StopReason != acp.StopReasonEndTurn || !strings.Contains(h.client.Text(), "file:///notes.txt") {
		t.Fatalf("%v %v %q", resp, err, h.client.Text())
	}
	_, err = h.conn.Prompt(context.Background(), acp.PromptRequest{SessionId: h.session, Prompt: []acp.ContentBlock{acp.TextBlock("  ")}})
	var re *acp.RequestError
	if !errors.As(err, &re) || re.Code != -32602 {
		t.Fatalf("blank prompt: %v", err)
	}
}

// session/cancel ends the turn whatever it waits on: a question, or a
// running command (whose process group is killed).
func TestCancelDuringQuestionAndCommand(t *testing.T) {
	cases := []struct {
		name, prompt, mode string
		setup              func(h *harness, waiting chan<- struct{})
	}{
		{"question", "anything?", builtinagent.ModeManual, func(h *harness, waiting chan<- struct{}) {
			h.client.OnElicit = func(ctx context.Context, _ acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error) {
				close(waiting)
				<-ctx.Done()
				return acp.NewUnstableCreateElicitationResponseCancel(), nil
			}
		}},
		{"command", "$ touch started && sleep 30 && touch finished", builtinagent.ModeSelfDrive, func(h *harness, waiting chan<- struct{}) {
			go func() {
				for {
					if _, err := os.Stat(filepath.Join(h.dir, "started")); err == nil {
						close(waiting)
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := start(t, builtinagent.Config{}, nil)
			waiting := make(chan struct{})
			c.setup(h, waiting)
			go func() {
				<-waiting
				_ = h.conn.Cancel(context.Background(), acp.CancelNotification{SessionId: h.session})
			}()
			began := time.Now()
			resp := h.mustPrompt(t, c.prompt, c.mode)
			if resp.StopReason != acp.StopReasonCancelled || time.Since(began) > 10*time.Second {
				t.Fatalf("stop %q after %v", resp.StopReason, time.Since(began))
			}
			if _, err := os.Stat(filepath.Join(h.dir, "finished")); err == nil {
				t.Fatal("the command went on after the cancel")
			}
			// The session goes on.
			h.client.Reset()
			if h.mustPrompt(t, "hi", builtinagent.ModeManual); h.client.Text() != "Hello from cohort/demo. You said: hi" {
				t.Fatalf("after cancel: %q", h.client.Text())
			}
		})
	}
}

// With a state directory, a session without a prompt for SessionIdleTTL
// leaves memory; a later prompt (or session/load) brings it back from its
// file, history included.
func TestIdleSessionsLeaveMemory(t *testing.T) {
	state := t.TempDir()
	h := start(t, builtinagent.Config{StateDir: state, SessionIdleTTL: 100 * time.Millisecond}, nil)
	h.mustPrompt(t, "remember this", builtinagent.ModeSelfDrive)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(h.logs.String(), `"msg":"agent: idle sessions left memory","forgotten":1,"live":0`) {
		if time.Now().After(deadline) {
			t.Fatalf("the idle session stayed in memory:\n%s", h.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp := h.mustPrompt(t, "and this", builtinagent.ModeSelfDrive); resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt after leaving memory: %v", resp.StopReason)
	}
	// A second client loads it: both prompts are in its history.
	h2 := start(t, builtinagent.Config{StateDir: state}, nil)
	if _, err := h2.conn.LoadSession(context.Background(), acp.LoadSessionRequest{SessionId: h.session, Cwd: h.dir, McpServers: []acp.McpServer{}}); err != nil {
		t.Fatal(err)
	}
	if got := h2.client.Text(); !strings.Contains(got, "remember this") || !strings.Contains(got, "and this") {
		t.Fatalf("history after leaving memory: %q", got)
	}
}

// With a state directory, past MaxSessions (and a quarter) the least
// recently prompted sessions leave memory at once, long before
// SessionIdleTTL, and a later prompt brings one back from its file.
func TestSessionsBounded(t *testing.T) {
	state := t.TempDir()
	h := start(t, builtinagent.Config{StateDir: state, MaxSessions: 4}, nil)
	first := h.session
	h.mustPrompt(t, "remember this", builtinagent.ModeSelfDrive)
	for range 5 {
		res, err := h.conn.NewSession(context.Background(), acp.NewSessionRequest{Cwd: h.dir, McpServers: []acp.McpServer{}})
		if err != nil {
			t.Fatal(err)
		}
		h.session = res.SessionId
		h.mustPrompt(t, "hi", builtinagent.ModeSelfDrive)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(h.logs.String(), `"msg":"agent: idle sessions left memory"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no session left memory past the bound:\n%s", h.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.session = first
	if resp := h.mustPrompt(t, "and this", builtinagent.ModeSelfDrive); resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt after leaving memory: %v", resp.StopReason)
	}
}
