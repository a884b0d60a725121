package builtinagent_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cohort-dev/cohort/internal/builtinagent"
	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
)

// mcpServer is a stateless MCP server over HTTP, as the intern daemon's is,
// whose echo tool answers with the credential of the request; it counts
// the requests of each credential.
type mcpServer struct {
	url  string
	mu   sync.Mutex
	seen map[string]int
}

func newMCPServer(t *testing.T) *mcpServer {
	m := &mcpServer{seen: map[string]int{}}
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		tok := r.Header.Get("Authorization")
		srv := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
		srv.AddTool(&mcp.Tool{Name: "echo", Description: "echo", InputSchema: map[string]any{"type": "object"}},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "from " + tok}}}, nil
			})
		return srv
	}, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.seen[r.Header.Get("Authorization")]++
		m.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	m.url = ts.URL + "/mcp"
	return m
}

func (m *mcpServer) requests(tok string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seen["Bearer "+tok]
}

func (m *mcpServer) entry(tok string) []acp.McpServer {
	return []acp.McpServer{{Http: &acp.McpServerHttpInline{Type: "http", Name: "cohort", Url: m.url,
		Headers: []acp.HttpHeader{{Name: "Authorization", Value: "Bearer " + tok}}}}}
}

func offersTool(req map[string]any, name string) bool {
	tools, _ := req["tools"].([]any)
	for _, t := range tools {
		f, _ := t.(map[string]any)["function"].(map[string]any)
		if f["name"] == name {
			return true
		}
	}
	return false
}

// The first session lists a server's tools at session/new; later sessions
// with the same server (another credential) are offered them from the
// agent's cache and connect, with their own credential, only when the model
// calls one.
func TestMCPConnectsOnFirstToolCall(t *testing.T) {
	const m = "m"
	srv := newMCPServer(t)
	up := agenttest.NewUpstream(t,
		agenttest.Answer(m, 1, 1, "one"),
		agenttest.Answer(m, 1, 1, "two"),
		agenttest.Call(m, "call_1", "echo", `{}`),
		agenttest.Answer(m, 1, 1, "done"))
	h := start(t, builtinagent.Config{Model: m, BaseURL: up.BaseURL()}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prompt := func(id acp.SessionId) {
		t.Helper()
		resp, err := h.conn.Prompt(ctx, acp.PromptRequest{SessionId: id, Prompt: []acp.ContentBlock{acp.TextBlock("go")}, Meta: map[string]any{builtinagent.MetaApprovalMode: builtinagent.ModeSelfDrive}})
		if err != nil || resp.StopReason != acp.StopReasonEndTurn {
			t.Fatalf("prompt: %v %v", resp.StopReason, err)
		}
	}

	s1, err := h.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: h.dir, McpServers: srv.entry("tok-a")})
	if err != nil {
		t.Fatal(err)
	}
	if srv.requests("tok-a") == 0 {
		t.Fatal("the first session did not list the server's tools")
	}
	prompt(s1.SessionId)

	s2, err := h.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: h.dir, McpServers: srv.entry("tok-b")})
	if err != nil {
		t.Fatal(err)
	}
	prompt(s2.SessionId) // answers without a tool
	if n := srv.requests("tok-b"); n != 0 {
		t.Fatalf("the second session made %d MCP requests before a tool call", n)
	}
	prompt(s2.SessionId) // calls echo
	reqs := up.Requests()
	if len(reqs) != 4 || !offersTool(reqs[1], "echo") || !offersTool(reqs[2], "echo") {
		t.Fatalf("the cached tool was not offered: %v", reqs)
	}
	tool := lastMessage(t, reqs[3])
	if tool["role"] != "tool" || tool["content"] != "from Bearer tok-b" {
		t.Fatalf("tool message %v", tool)
	}
	if srv.requests("tok-b") == 0 {
		t.Fatal("the call did not use the session's own credential")
	}
	b, _ := json.Marshal(reqs[3])
	if strings.Contains(string(b), "tok-a") {
		t.Fatal("the first session's credential reached the second's turn")
	}
}
