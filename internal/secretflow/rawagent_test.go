package secretflow_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"
	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// rawAgent is a third-party ACP agent that knows nothing of Cohort: it
// takes the MCP servers session/new gives it and, on a prompt, calls the
// http_request tool with plain JSON-RPC over HTTP (no MCP SDK), then
// says what it got back.
type rawAgent struct {
	conn    *acp.AgentSideConnection
	servers map[acp.SessionId][]acp.McpServer
}

func runRawAgent() {
	a := &rawAgent{servers: map[acp.SessionId][]acp.McpServer{}}
	a.conn = acp.NewAgentSideConnection(a, os.Stdout, os.Stdin)
	<-a.conn.Done()
	os.Exit(0)
}

func (a *rawAgent) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{ProtocolVersion: acp.ProtocolVersionNumber, AuthMethods: []acp.AuthMethod{},
		AgentInfo:         &acp.Implementation{Name: "raw-agent", Version: "1"},
		AgentCapabilities: acp.AgentCapabilities{McpCapabilities: acp.McpCapabilities{Http: true}}}, nil
}

func (a *rawAgent) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

func (a *rawAgent) NewSession(ctx context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	id := acp.SessionId(fmt.Sprintf("raw-%d", len(a.servers)+1))
	a.servers[id] = p.McpServers
	return acp.NewSessionResponse{SessionId: id}, nil
}

func (a *rawAgent) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	text := ""
	for _, b := range p.Prompt {
		if b.Text != nil {
			text = b.Text.Text
		}
	}
	out := "no MCP server"
	for _, s := range a.servers[p.SessionId] {
		if s.Http == nil {
			continue
		}
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
			"params": map[string]any{"name": "http_request", "arguments": json.RawMessage(text)}})
		req, _ := http.NewRequestWithContext(ctx, "POST", s.Http.Url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for _, h := range s.Http.Headers {
			req.Header.Set(h.Name, h.Value)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			out = "error: " + err.Error()
			break
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		out = fmt.Sprintf("MCP %d: %s", res.StatusCode, b)
	}
	a.conn.SessionUpdate(ctx, acp.SessionNotification{SessionId: p.SessionId, Update: acp.UpdateAgentMessageText(out)})
	return acp.PromptResponse{StopReason: acp.StopReasonEndTurn}, nil
}

func (a *rawAgent) Cancel(context.Context, acp.CancelNotification) error { return nil }

func (a *rawAgent) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, nil
}

func (a *rawAgent) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, nil
}

func (a *rawAgent) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, nil
}

func (a *rawAgent) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, nil
}

func (a *rawAgent) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, nil
}

// TestThirdPartyAgentGetsTheSameTool: an ACP agent that is not Cohort's
// finds http_request in session/new's mcpServers and gets host-bound
// secrets the same way, without ever holding the value.
func TestThirdPartyAgentGetsTheSameTool(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFlowWith(t, db, "raw")
		b, _ := json.Marshal(map[string]any{"hosts": []string{"api.example.com"}, "value": "third-party-secret-42"})
		if st, body, _ := f.e.Do(t, "PUT", "/vault/interns/"+f.e.InternID+"/secrets/api_key", f.e.WorkspaceKey, "application/json", string(b)); st != 201 {
			t.Fatal(st, body)
		}
		s := f.chat(t, userBody("self-drive", f.callArgs("/raw")))
		if !strings.Contains(s, "MCP 200") || !strings.Contains(s, `Bearer {{secret:api_key}}`) {
			t.Fatalf("stream: %s", s)
		}
		got := f.host.requests()
		if len(got) != 1 || !strings.Contains(got[0], "auth=Bearer third-party-secret-42") {
			t.Fatalf("bound host: %q", got)
		}
		for where, text := range f.everything(t, s) {
			if strings.Contains(text, "third-party-secret-42") {
				t.Fatalf("leaked into %s", where)
			}
		}
	})
}
