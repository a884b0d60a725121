// Command shellagent stands in for a third-party ACP agent in the escape
// suite: like Claude Code or Codex, it runs shell commands with its own
// tools, not Cohort's. Every prompt is run as `sh -c PROMPT` in the
// session's directory and its output is the reply.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	acp "github.com/coder/acp-go-sdk"
)

type agent struct {
	conn *acp.AgentSideConnection
	cwd  map[acp.SessionId]string
}

func main() {
	a := &agent{cwd: map[acp.SessionId]string{}}
	a.conn = acp.NewAgentSideConnection(a, os.Stdout, os.Stdin)
	<-a.conn.Done()
}

func (a *agent) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber, AuthMethods: []acp.AuthMethod{},
		AgentInfo: &acp.Implementation{Name: "shell-agent", Version: "1"}}, nil
}

func (a *agent) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

func (a *agent) NewSession(_ context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	id := acp.SessionId(fmt.Sprintf("shell-%d", len(a.cwd)+1))
	a.cwd[id] = p.Cwd
	return acp.NewSessionResponse{SessionId: id}, nil
}

func (a *agent) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	text := ""
	for _, b := range p.Prompt {
		if b.Text != nil {
			text = b.Text.Text
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", text)
	if st, err := os.Stat(a.cwd[p.SessionId]); err == nil && st.IsDir() {
		cmd.Dir = a.cwd[p.SessionId]
	}
	out, err := cmd.CombinedOutput()
	reply := string(out)
	if err != nil {
		reply += "\n[" + err.Error() + "]"
	}
	if reply == "" {
		reply = "(no output)"
	}
	a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: acp.UpdateAgentMessageText(reply)})
	return acp.PromptResponse{StopReason: acp.StopReasonEndTurn}, nil
}

func (a *agent) Cancel(context.Context, acp.CancelNotification) error { return nil }

func (a *agent) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, nil
}

func (a *agent) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, nil
}

func (a *agent) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, nil
}

func (a *agent) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, nil
}

func (a *agent) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, nil
}
