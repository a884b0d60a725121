package internd_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	acp "github.com/coder/acp-go-sdk"
)

// The scripted ACP test agent. TestMain re-executes the test binary with
// INTERND_TEST_AGENT set, and the binary then speaks ACP on stdio:
//
//	INTERND_TEST_AGENT=1        a normal agent (no session/load)
//	INTERND_TEST_AGENT=load     an agent that supports session/load
//	INTERND_TEST_AGENT=noinit   never answers initialize
//	INTERND_TEST_AGENT=refuse   refuses session/new in its own words, echoing
//	                            its OPENAI_API_KEY and padding past any bound
//	INTERND_TEST_AGENT=refuseinit  refuses initialize likewise
//	INTERND_TEST_AGENT=auth     advertises auth method "test-login" and
//	                            refuses session/new until authenticated with it
//
// What a turn does is chosen by the prompt's first word (see Prompt).
func runTestAgent(mode string) {
	if mode == "noinit" {
		// Read and ignore everything, forever.
		buf := make([]byte, 4096)
		for {
			if _, err := os.Stdin.Read(buf); err != nil {
				os.Exit(0)
			}
		}
	}
	a := &testAgent{load: mode == "load", mode: mode, cancels: map[acp.SessionId]context.CancelFunc{}, paired: make(chan struct{})}
	a.conn = acp.NewAgentSideConnection(a, os.Stdout, os.Stdin)
	<-a.conn.Done()
	os.Exit(0)
}

type testAgent struct {
	conn   *acp.AgentSideConnection
	load   bool
	mode   string
	authed bool

	mu      sync.Mutex
	n       int
	cancels map[acp.SessionId]context.CancelFunc
	// pairs counts the pairperm prompts that have begun; paired is closed
	// when the second begins.
	pairs  int
	paired chan struct{}
}

func (a *testAgent) Authenticate(ctx context.Context, p acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	if p.MethodId != "test-login" {
		return acp.AuthenticateResponse{}, &acp.RequestError{Code: -32602, Message: "unknown auth method " + p.MethodId}
	}
	a.mu.Lock()
	a.authed = true
	a.mu.Unlock()
	return acp.AuthenticateResponse{}, nil
}

// refusal is the refuse modes' error: the agent's words, a key it should
// not have repeated, and a tail longer than any caller needs.
func refusal(what string) error {
	return &acp.RequestError{Code: -32000, Message: what + " (key " + os.Getenv("OPENAI_API_KEY") + ", config key " + os.Getenv("INTERND_TEST_ECHO") + ")",
		Data: map[string]any{"details": strings.Repeat("x", 2000)}}
}

func (a *testAgent) Initialize(ctx context.Context, p acp.InitializeRequest) (acp.InitializeResponse, error) {
	if a.mode == "refuseinit" {
		return acp.InitializeResponse{}, refusal("Unsupported client: upgrade cohort")
	}
	methods := []acp.AuthMethod{}
	if a.mode == "auth" {
		methods = append(methods, acp.AuthMethod{Agent: &acp.AuthMethodAgent{Id: "test-login", Name: "Test login"}})
	}
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber, AuthMethods: methods,
		AgentInfo:         &acp.Implementation{Name: "test-agent", Version: "0.1"},
		AgentCapabilities: acp.AgentCapabilities{LoadSession: a.load}}, nil
}

func (a *testAgent) Cancel(ctx context.Context, p acp.CancelNotification) error {
	a.mu.Lock()
	c := a.cancels[p.SessionId]
	a.mu.Unlock()
	if c != nil {
		c()
	}
	return nil
}

func (a *testAgent) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, nil
}

func (a *testAgent) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, nil
}

func (a *testAgent) NewSession(ctx context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	a.mu.Lock()
	authed := a.authed
	a.mu.Unlock()
	if a.mode == "auth" && !authed {
		return acp.NewSessionResponse{}, &acp.RequestError{Code: -32000, Message: "Authentication required: call authenticate with method test-login first"}
	}
	if a.mode == "refuse" {
		return acp.NewSessionResponse{}, refusal("Authentication required: call authenticate with method chatgpt first; model gpt-9 is not available")
	}
	a.mu.Lock()
	a.n++
	id := fmt.Sprintf("agent-session-%d-%d", os.Getpid(), a.n)
	a.mu.Unlock()
	return acp.NewSessionResponse{SessionId: acp.SessionId(id),
		Models: &acp.SessionModelState{CurrentModelId: "test/current", AvailableModels: []acp.ModelInfo{}}}, nil
}

func (a *testAgent) LoadSession(ctx context.Context, p acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	// Replay some history, as real agents do; it must not reach any stream.
	a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: acp.UpdateAgentMessageText("replayed history")})
	return acp.LoadSessionResponse{}, nil
}

func (a *testAgent) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, nil
}

func (a *testAgent) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, nil
}

func (a *testAgent) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, nil
}

func (a *testAgent) say(ctx context.Context, sid acp.SessionId, model, text string) {
	n := acp.SessionNotification{SessionId: sid, Update: acp.UpdateAgentMessageText(text)}
	if model != "" {
		n.Meta = map[string]any{"cohort.dev/model": model}
	}
	a.conn.SessionUpdate(ctx, n)
}

func (a *testAgent) think(ctx context.Context, sid acp.SessionId, model, text string) {
	n := acp.SessionNotification{SessionId: sid, Update: acp.UpdateAgentThoughtText(text)}
	if model != "" {
		n.Meta = map[string]any{"cohort.dev/model": model}
	}
	a.conn.SessionUpdate(ctx, n)
}

func (a *testAgent) permission(ctx context.Context, sid acp.SessionId) string {
	title := "shell"
	res, err := a.conn.RequestPermission(ctx, acp.RequestPermissionRequest{SessionId: sid,
		// A shell call as agents send it; the env must not reach the caller.
		ToolCall: acp.ToolCallUpdate{ToolCallId: "tc1", Title: &title,
			RawInput: map[string]any{"command": "ls -la /work", "env": map[string]any{"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"}},
			Content:  []acp.ToolCallContent{acp.ToolContent(acp.TextBlock("$ ls -la /work"))}},
		Options: []acp.PermissionOption{
			{Kind: "allow_once", Name: "Allow once", OptionId: "opt-ao"},
			{Kind: "allow_always", Name: "Allow always", OptionId: "opt-aa"},
			{Kind: "reject_once", Name: "Reject once", OptionId: "opt-ro"},
			{Kind: "reject_always", Name: "Reject always", OptionId: "opt-ra"},
		}})
	switch {
	case err != nil:
		return "error"
	case res.Outcome.Selected != nil:
		return string(res.Outcome.Selected.OptionId)
	default:
		return "cancelled"
	}
}

func (a *testAgent) elicit(ctx context.Context, sid acp.SessionId, withMeta bool) string {
	form := &acp.UnstableCreateElicitationForm{Message: "Tell me about you", RequestedSchema: acp.UnstableElicitationSchema{
		Type: "object",
		Properties: map[string]any{
			"name":  map[string]any{"type": "string"},
			"color": map[string]any{"type": "string", "enum": []any{"red", "blue"}},
			"age":   map[string]any{"type": "integer"},
			"agree": map[string]any{"type": "boolean"},
			"ratio": map[string]any{"type": "number"},
		},
		Required: []string{"name"},
	}}
	if withMeta {
		form.Meta = map[string]any{"cohort.dev/session_id": string(sid)}
	}
	res, err := a.conn.UnstableCreateElicitation(ctx, acp.UnstableCreateElicitationRequest{Form: form})
	switch {
	case err != nil:
		return "error"
	case res.Accept != nil:
		b, _ := json.Marshal(res.Accept.Content)
		return "accept " + string(b)
	case res.Decline != nil:
		return "decline"
	default:
		return "cancel"
	}
}

// roundTrip makes a request the daemon answers at once (it offers no file
// system: method not found). The daemon reads the agent's output in order,
// so its answer means it has handled every line the agent wrote before.
func (a *testAgent) roundTrip(ctx context.Context, sid acp.SessionId) {
	a.conn.ReadTextFile(ctx, acp.ReadTextFileRequest{SessionId: sid, Path: "/"})
}

func endTurn() acp.PromptResponse { return acp.PromptResponse{StopReason: acp.StopReasonEndTurn} }

// Prompt runs the script named by the prompt's first word.
func (a *testAgent) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.mu.Lock()
	a.cancels[p.SessionId] = cancel
	a.mu.Unlock()
	text := ""
	if len(p.Prompt) > 0 && p.Prompt[0].Text != nil {
		text = p.Prompt[0].Text.Text
	}
	word, rest, _ := strings.Cut(text, " ")
	sid := p.SessionId
	switch word {
	case "hello":
		a.think(ctx, sid, "test/model-a", "thinking")
		a.say(ctx, sid, "test/model-a", "Hello")
		a.say(ctx, sid, "test/model-b", ", world")
		cached := 2
		return acp.PromptResponse{StopReason: acp.StopReasonEndTurn,
			Usage: &acp.Usage{InputTokens: 10, OutputTokens: 5, TotalTokens: 15, CachedReadTokens: &cached},
			Meta:  map[string]any{"cohort.dev/cost": 0.25}}, nil
	case "nometa":
		a.say(ctx, sid, "", "plain")
		return endTurn(), nil
	case "mode":
		m, _ := p.Meta["cohort.dev/approval_mode"].(string)
		a.say(ctx, sid, "", m)
		return endTurn(), nil
	case "len":
		a.say(ctx, sid, "", strconv.Itoa(len([]rune(text))))
		return endTurn(), nil
	case "seccomp":
		// The agent process's own syscall filters, as the kernel counts them.
		status, _ := os.ReadFile("/proc/self/status")
		for _, l := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(l, "Seccomp_filters:"); ok {
				a.say(ctx, sid, "", strings.TrimSpace(v))
			}
		}
		return endTurn(), nil
	case "env":
		a.say(ctx, sid, "", "["+os.Getenv(rest)+"]")
		return endTurn(), nil
	case "whoami":
		a.say(ctx, sid, "", string(sid))
		return endTurn(), nil
	case "perm":
		a.say(ctx, sid, "test/model-a", "asking")
		a.say(ctx, sid, "", "permission: "+a.permission(ctx, sid))
		return endTurn(), nil
	case "perm2":
		first := a.permission(ctx, sid)
		second := a.permission(ctx, sid)
		a.say(ctx, sid, "", first+" "+second)
		return endTurn(), nil
	case "pairperm":
		// Asks only once two pairperm prompts run at once, so both turns
		// have started before either pauses.
		a.mu.Lock()
		if a.pairs++; a.pairs == 2 {
			close(a.paired)
		}
		a.mu.Unlock()
		select {
		case <-a.paired:
		case <-ctx.Done():
			return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
		}
		a.say(ctx, sid, "", "permission: "+a.permission(ctx, sid))
		return endTurn(), nil
	case "ask":
		a.say(ctx, sid, "", a.elicit(ctx, sid, true))
		return endTurn(), nil
	case "askurl":
		res, err := a.conn.UnstableCreateElicitation(ctx, acp.UnstableCreateElicitationRequest{Url: &acp.UnstableCreateElicitationUrl{
			Message: "open this", ElicitationId: "e1", Url: "https://example.test/form"}})
		switch {
		case err != nil:
			a.say(ctx, sid, "", "error")
		case res.Cancel != nil:
			a.say(ctx, sid, "", "cancel")
		default:
			a.say(ctx, sid, "", "other")
		}
		return endTurn(), nil
	case "asknometa":
		a.say(ctx, sid, "", a.elicit(ctx, sid, false))
		return endTurn(), nil
	case "crash":
		a.say(ctx, sid, "", "about to crash")
		// Exit only once the daemon has read that line: exiting with it
		// still in the pipe could lose it when the daemon reaps the process.
		a.roundTrip(ctx, sid)
		os.Exit(3)
	case "hang":
		a.say(ctx, sid, "", "hanging")
		<-ctx.Done()
		return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
	case "hanghard":
		a.say(ctx, sid, "", "hanging hard")
		select {}
	case "stop":
		a.say(ctx, sid, "", "stopping")
		return acp.PromptResponse{StopReason: acp.StopReason(rest)}, nil
	case "fail":
		return acp.PromptResponse{}, &acp.RequestError{Code: -32603, Message: "model upstream returned HTTP 500: boom", Data: map[string]any{"reason": "turn_failed"}}
	case "timeout":
		return acp.PromptResponse{}, &acp.RequestError{Code: -32603, Message: "model upstream timed out: slow", Data: map[string]any{"reason": "timeout"}}
	case "stream":
		n, _ := strconv.Atoi(rest)
		for i := 0; i < n; i++ {
			a.say(ctx, sid, "m", "x")
		}
		return endTurn(), nil
	case "altstream":
		// Each delta names another model than the one before it, so the
		// daemon never merges two into one event, however far its
		// consumer lags.
		n, _ := strconv.Atoi(rest)
		for i := 0; i < n; i++ {
			a.say(ctx, sid, []string{"m1", "m2"}[i%2], "x")
		}
		return endTurn(), nil
	case "rawstream":
		// As fast as an agent can write: pre-encoded session/update lines
		// straight to stdout. Safe only because the SDK writes nothing
		// else while this one prompt runs.
		n, _ := strconv.Atoi(rest)
		line := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"` + string(sid) +
			`","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}},"_meta":{"cohort.dev/model":"m"}}}` + "\n")
		w := bufio.NewWriterSize(os.Stdout, 64<<10)
		for i := 0; i < n; i++ {
			w.Write(line)
		}
		w.Flush()
		return endTurn(), nil
	}
	a.say(ctx, sid, "", "unknown script "+word)
	return endTurn(), nil
}
