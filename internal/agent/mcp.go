package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	acp "github.com/coder/acp-go-sdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpTool is a tool of an MCP server the client gave the session (the
// intern daemon's http_request, for one), offered to the model under its
// own name and called over the server's streamable HTTP transport.
type mcpTool struct {
	spec ToolSpec
	cs   *mcp.ClientSession
}

// headerTransport adds the MCP server's configured headers (its
// credential) to every request.
type headerTransport struct {
	h    http.Header
	next http.RoundTripper
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, vs := range t.h {
		r.Header[k] = vs
	}
	return t.next.RoundTrip(r)
}

// connectMCP connects to the session's HTTP MCP servers and lists their
// tools. A server that cannot be reached is logged and skipped: the session
// works without its tools. Tool names that clash with the built-in tools,
// or with an earlier server's, are skipped too.
func (a *Agent) connectMCP(ctx context.Context, servers []acp.McpServer) []mcpTool {
	var out []mcpTool
	for _, srv := range servers {
		if srv.Http == nil {
			continue
		}
		h := http.Header{}
		for _, kv := range srv.Http.Headers {
			h.Add(kv.Name, kv.Value)
		}
		// No overall timeout: a call may wait on the user's approval.
		hc := &http.Client{Transport: headerTransport{h: h, next: http.DefaultTransport}}
		c := mcp.NewClient(&mcp.Implementation{Name: "cohort-agent", Version: a.cfg.Version}, nil)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cs, err := c.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: srv.Http.Url, HTTPClient: hc, MaxRetries: -1}, nil)
		if err != nil {
			cancel()
			a.cfg.Logger.Warn("agent: MCP server not reachable", "server", srv.Http.Name, "err", err)
			continue
		}
		res, err := cs.ListTools(cctx, nil)
		cancel()
		if err != nil {
			a.cfg.Logger.Warn("agent: MCP server lists no tools", "server", srv.Http.Name, "err", err)
			cs.Close()
			continue
		}
		for _, t := range res.Tools {
			if t.Name == ToolShell || t.Name == ToolAskUser || slices.ContainsFunc(out, func(m mcpTool) bool { return m.spec.Name == t.Name }) {
				continue
			}
			params, _ := t.InputSchema.(map[string]any)
			if params == nil {
				params = map[string]any{"type": "object"}
			}
			out = append(out, mcpTool{spec: ToolSpec{Name: t.Name, Description: t.Description, Parameters: params}, cs: cs})
		}
		a.cfg.Logger.Info("agent: MCP server connected", "server", srv.Http.Name, "tools", len(res.Tools))
	}
	return out
}

// mcpCall runs a tool call on its MCP server. The result text goes to the
// model as is: the server shapes it for the model (errors included).
func (t *turn) mcpCall(ctx context.Context, m mcpTool, call ToolCall) (string, error) {
	id := acp.ToolCallId(call.ID)
	var args map[string]any
	if err := decodeArgs(call.Arguments, &args); err != nil {
		_ = t.update(acp.StartToolCall(id, m.spec.Name, acp.WithStartKind(acp.ToolKindFetch), acp.WithStartStatus(acp.ToolCallStatusFailed)))
		return toolError(fmt.Sprintf("invalid arguments for %s (%v); expected a JSON object", m.spec.Name, err)), nil
	}
	_ = t.update(acp.StartToolCall(id, m.spec.Name, acp.WithStartKind(acp.ToolKindFetch), acp.WithStartStatus(acp.ToolCallStatusInProgress)))
	res, err := m.cs.CallTool(ctx, &mcp.CallToolParams{Name: m.spec.Name, Arguments: args})
	if err != nil {
		if ctx.Err() != nil {
			return "", errCancelled
		}
		return t.failCall(call.ID, fmt.Sprintf("the %s tool failed: %v", m.spec.Name, err)), nil
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	text := b.String()
	if text == "" && res.StructuredContent != nil {
		j, _ := json.Marshal(res.StructuredContent)
		text = string(j)
	}
	status := acp.ToolCallStatusCompleted
	if res.IsError {
		status = acp.ToolCallStatusFailed
	}
	_ = t.update(acp.UpdateToolCall(id, acp.WithUpdateStatus(status)))
	return text, nil
}
