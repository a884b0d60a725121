package builtinagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpTool is a tool of an MCP server the client gave the session (the
// intern daemon's http_request, for one), offered to the model under its
// own name and called over the server's streamable HTTP transport.
type mcpTool struct {
	spec ToolSpec
	conn *mcpConn
}

// mcpConn is one of a session's MCP servers. Its connection (initialize,
// notifications/initialized: two requests) is opened on the first call of
// one of its tools, not at session/new: most turns call none, and the
// daemon gives every session a server of its own.
type mcpConn struct {
	a    *Agent
	name string
	url  string
	hdr  http.Header

	mu     sync.Mutex
	cs     *mcp.ClientSession
	closed bool
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

// session returns the server's client session, connecting on first use.
func (c *mcpConn) session(ctx context.Context) (*mcp.ClientSession, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("the session's MCP connection is closed")
	}
	if c.cs != nil {
		return c.cs, nil
	}
	// No overall timeout on the client: a call may wait on the user's
	// approval. The connection itself gets 10 s.
	hc := &http.Client{Transport: headerTransport{h: c.hdr, next: http.DefaultTransport}}
	cl := mcp.NewClient(&mcp.Implementation{Name: "cohort-agent", Version: c.a.cfg.Version}, nil)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cs, err := cl.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: c.url, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		return nil, err
	}
	c.cs = cs
	return cs, nil
}

func (c *mcpConn) close() {
	c.mu.Lock()
	cs := c.cs
	c.cs, c.closed = nil, true
	c.mu.Unlock()
	if cs != nil {
		cs.Close()
	}
}

// mcpKey names a server's tool list in the agent's cache: its name, its
// address and the names (not the values) of its headers.
func mcpKey(srv *acp.McpServerHttpInline) string {
	var b strings.Builder
	b.WriteString(srv.Name)
	b.WriteByte(0)
	b.WriteString(srv.Url)
	for _, kv := range srv.Headers {
		b.WriteByte(0)
		b.WriteString(kv.Name)
	}
	return b.String()
}

// connectMCP gives the session's HTTP MCP servers and their tools. The
// tool list of a server seen before (same name, address and header names:
// the daemon's, whose credential alone changes per session) comes from the
// agent's cache, and its connection waits for a tool call. A server not
// seen before is connected and listed now; one that cannot be reached is
// logged and skipped: the session works without its tools. Tool names that
// clash with the built-in tools, or with an earlier server's, are skipped.
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
		conn := &mcpConn{a: a, name: srv.Http.Name, url: srv.Http.Url, hdr: h}
		key := mcpKey(srv.Http)
		a.mu.Lock()
		specs, cached := a.mcpSpecs[key]
		a.mu.Unlock()
		if !cached {
			var err error
			if specs, err = conn.list(ctx); err != nil {
				conn.close()
				a.cfg.Logger.Warn("agent: MCP server not reachable", "server", srv.Http.Name, "err", err)
				continue
			}
			a.mu.Lock()
			if a.mcpSpecs == nil {
				a.mcpSpecs = map[string][]ToolSpec{}
			}
			a.mcpSpecs[key] = specs
			a.mu.Unlock()
			a.cfg.Logger.Info("agent: MCP server connected", "server", srv.Http.Name, "tools", len(specs))
		}
		for _, spec := range specs {
			if spec.Name == ToolShell || spec.Name == ToolAskUser || slices.ContainsFunc(out, func(m mcpTool) bool { return m.spec.Name == spec.Name }) {
				continue
			}
			out = append(out, mcpTool{spec: spec, conn: conn})
		}
	}
	return out
}

// list connects and lists the server's tools.
func (c *mcpConn) list(ctx context.Context) ([]ToolSpec, error) {
	cs, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := cs.ListTools(cctx, nil)
	if err != nil {
		return nil, fmt.Errorf("tools/list: %w", err)
	}
	specs := make([]ToolSpec, 0, len(res.Tools))
	for _, t := range res.Tools {
		params, _ := t.InputSchema.(map[string]any)
		if params == nil {
			params = map[string]any{"type": "object"}
		}
		specs = append(specs, ToolSpec{Name: t.Name, Description: t.Description, Parameters: params})
	}
	return specs, nil
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
	cs, err := m.conn.session(ctx)
	var res *mcp.CallToolResult
	if err == nil {
		res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: m.spec.Name, Arguments: args})
	}
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
