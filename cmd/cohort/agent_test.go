package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/cohort-dev/cohort/internal/builtinagent"
	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
	"github.com/cohort-dev/cohort/internal/builtinagent/sandbox"
)

// TestAgentChild is not a test: it is `cohort agent` when the test binary is
// re-executed by startAgentProcess.
func TestAgentChild(t *testing.T) {
	if os.Getenv("COHORT_AGENT_TEST_CHILD") != "1" {
		t.Skip("runs only as the re-executed agent process")
	}
	args := append([]string{"agent"}, strings.Fields(os.Getenv("COHORT_AGENT_TEST_ARGS"))...)
	if err := run(context.Background(), args, os.Stdout, os.Stderr); err != nil {
		os.Stderr.WriteString("cohort: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startAgentProcess runs `cohort agent` (this test binary re-executed) with
// args and env, and connects the SDK's client side to its stdio.
func startAgentProcess(t *testing.T, args string, env ...string) (*acp.ClientSideConnection, *agenttest.Client, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAgentChild$")
	cmd.Env = append(os.Environ(), "COHORT_AGENT_TEST_CHILD=1", "COHORT_AGENT_TEST_ARGS="+args)
	cmd.Env = append(cmd.Env, env...)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close() // the agent exits when its client hangs up
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent process: %v\n%s", err, stderr)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("the agent did not exit when its stdin closed")
		}
	})
	c := &agenttest.Client{}
	conn := acp.NewClientSideConnection(c, stdin, stdout)
	if _, err := conn.Initialize(context.Background(), agenttest.Initialize()); err != nil {
		t.Fatalf("initialize: %v\n%s", err, stderr)
	}
	return conn, c, stderr
}

func TestAgentProcessAgainstUpstream(t *testing.T) {
	if !sandbox.Available() {
		t.Skip("SKIPPING: this machine cannot make namespaces; the sandbox is untested")
	}
	const m = "upstream/model"
	const key = "sk-binary-secret-42"
	up := agenttest.NewUpstream(t,
		agenttest.Call(m, "call_1", "shell", `{"command":"echo from-the-sandbox"}`),
		agenttest.Step{Chunks: []string{agenttest.Reasoning(m, "reasoning", "done"), agenttest.Text(m, "All done."),
			agenttest.Finish(m, "stop"), agenttest.Usage(m, 30, 3, 10, 0.5)}},
	)
	conn, client, stderr := startAgentProcess(t, "--model "+m+" --model-retries 0",
		"COHORT_AGENT_BASE_URL="+up.BaseURL(), "COHORT_AGENT_API_KEY="+key, "OPENAI_API_KEY=")
	client.OnPermission = agenttest.Select(builtinagent.OptionAllowOnce)
	dir := t.TempDir()
	s, err := conn.NewSession(context.Background(), acp.NewSessionRequest{Cwd: dir, McpServers: []acp.McpServer{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := conn.Prompt(ctx, acp.PromptRequest{SessionId: s.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock("run it")},
		Meta: map[string]any{builtinagent.MetaApprovalMode: builtinagent.ModeManual}})
	if err != nil {
		t.Fatalf("prompt: %v\n%s", err, stderr)
	}
	if resp.StopReason != acp.StopReasonEndTurn || client.Text() != "All done." || client.Thought() != "done" {
		t.Fatalf("stop %q text %q thought %q", resp.StopReason, client.Text(), client.Thought())
	}
	if len(client.Permissions()) != 1 {
		t.Fatal("manual mode did not ask")
	}
	if resp.Usage == nil || resp.Usage.InputTokens != 40 || resp.Usage.OutputTokens != 8 || resp.Meta[builtinagent.MetaCost] != 0.5 {
		t.Fatalf("usage %+v meta %v", resp.Usage, resp.Meta)
	}
	reqs := up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model calls", len(reqs))
	}
	msgs, _ := reqs[1]["messages"].([]any)
	last, _ := msgs[len(msgs)-1].(map[string]any)
	if content, _ := last["content"].(string); !strings.Contains(content, `"output":"from-the-sandbox\n"`) || !strings.Contains(content, `"sandboxed":true`) {
		t.Fatalf("tool result %v", last)
	}
	for _, a := range up.Authorizations() {
		if a != "Bearer "+key {
			t.Fatalf("authorization %q", a)
		}
	}
	if strings.Contains(stderr.String(), key) {
		t.Fatal("the API key reached the agent's log")
	}
	if !strings.Contains(stderr.String(), `"api_key_set":true`) {
		t.Fatalf("log %s", stderr)
	}
}

func TestAgentProcessDemoQuestion(t *testing.T) {
	conn, client, stderr := startAgentProcess(t, "")
	client.OnElicit = func(_ context.Context, p acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error) {
		return acp.UnstableCreateElicitationResponse{Accept: &acp.UnstableCreateElicitationAccept{Action: "accept", Content: map[string]any{"answer": "blue"}}}, nil
	}
	s, err := conn.NewSession(context.Background(), acp.NewSessionRequest{Cwd: t.TempDir(), McpServers: []acp.McpServer{}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Models == nil || s.Models.CurrentModelId != builtinagent.DemoModelID {
		t.Fatalf("default model %+v", s.Models)
	}
	resp, err := conn.Prompt(context.Background(), acp.PromptRequest{SessionId: s.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock("which colour?")}})
	if err != nil {
		t.Fatalf("prompt: %v\n%s", err, stderr)
	}
	if resp.StopReason != acp.StopReasonEndTurn || client.Text() != "Thanks. You answered: blue" || len(client.Elicitations()) != 1 {
		t.Fatalf("stop %q text %q", resp.StopReason, client.Text())
	}
}

func TestAgentFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"agent", "stray"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "stray") {
		t.Fatalf("err %v", err)
	}
	if err := run(context.Background(), []string{"agent", "--log-level", "loud"}, &out, &errb); err == nil {
		t.Fatal("bad log level accepted")
	}
	if out.Len() != 0 {
		t.Fatalf("stdout carries only the protocol, got %q", out.String())
	}
}
