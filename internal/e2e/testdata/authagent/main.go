// Command authagent stands in for an ACP agent that requires
// authentication, as Codex (ChatGPT login or API key) and Gemini CLI do: it
// advertises the method "test-login" in initialize and refuses session/new
// until the client has called authenticate with it. Its refusal repeats the
// model key it was given, as careless agents do, so that a test can see the
// daemon redact it. Prompts are answered with "authenticated: PROMPT".
package main

import (
	"context"
	"fmt"
	"os"
	"sync"

	acp "github.com/coder/acp-go-sdk"
)

const method = "test-login"

type agent struct {
	conn *acp.AgentSideConnection

	mu     sync.Mutex
	authed bool
	n      int
}

func main() {
	a := &agent{}
	a.conn = acp.NewAgentSideConnection(a, os.Stdout, os.Stdin)
	<-a.conn.Done()
}

func (a *agent) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber,
		AuthMethods: []acp.AuthMethod{{Agent: &acp.AuthMethodAgent{Id: method, Name: "Test login"}}},
		AgentInfo:   &acp.Implementation{Name: "auth-agent", Version: "1"}}, nil
}

func (a *agent) Authenticate(_ context.Context, p acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	if p.MethodId != method {
		return acp.AuthenticateResponse{}, &acp.RequestError{Code: -32602, Message: "unknown auth method " + p.MethodId}
	}
	a.mu.Lock()
	a.authed = true
	a.mu.Unlock()
	return acp.AuthenticateResponse{}, nil
}

func (a *agent) NewSession(context.Context, acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.authed {
		return acp.NewSessionResponse{}, &acp.RequestError{Code: -32000,
			Message: "Authentication required: call authenticate with method " + method + " first (key " + os.Getenv("COHORT_AGENT_API_KEY") + ")"}
	}
	a.n++
	return acp.NewSessionResponse{SessionId: acp.SessionId(fmt.Sprintf("auth-%d", a.n))}, nil
}

func (a *agent) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	text := ""
	for _, b := range p.Prompt {
		if b.Text != nil {
			text = b.Text.Text
		}
	}
	a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: acp.UpdateAgentMessageText("authenticated: " + text)})
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
