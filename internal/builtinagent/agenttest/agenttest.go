// Package agenttest holds test doubles for the built-in agent's tests: a
// scripted OpenAI-compatible upstream (an httptest server answering
// chat-completions with scripted SSE, errors, hangs and broken streams) and
// an ACP client that records what the agent sends.
package agenttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	acp "github.com/coder/acp-go-sdk"
)

// Step is the scripted answer to one chat-completions request.
type Step struct {
	// Status, when not 0 or 200, answers with that status and an OpenAI-style
	// error body carrying ErrorMessage.
	Status       int
	ErrorMessage string
	// Chunks are the `data:` payloads, in order; "[DONE]" follows unless
	// CloseMidStream.
	Chunks []string
	// CloseMidStream drops the connection after Chunks, without the end of
	// the chunked body.
	CloseMidStream bool
	// EndWithoutDone ends the body cleanly after Chunks, without [DONE].
	EndWithoutDone bool
	// Hang, after Chunks, holds the response open until the client goes away.
	Hang bool
}

// Upstream is a scripted OpenAI-compatible chat-completions server.
type Upstream struct {
	*httptest.Server

	mu       sync.Mutex
	steps    []Step
	requests []map[string]any
	auth     []string
}

// NewUpstream starts an upstream answering requests with steps in order; once
// they run out it answers 500 "no scripted response".
func NewUpstream(t testing.TB, steps ...Step) *Upstream {
	u := &Upstream{steps: steps}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		u.CloseClientConnections()
		u.Close()
	})
	return u
}

// BaseURL is the "/v1" base the agent is configured with.
func (u *Upstream) BaseURL() string { return u.URL + "/v1" }

// Push appends steps.
func (u *Upstream) Push(steps ...Step) {
	u.mu.Lock()
	u.steps = append(u.steps, steps...)
	u.mu.Unlock()
}

// Requests returns the decoded request bodies received so far.
func (u *Upstream) Requests() []map[string]any {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]map[string]any(nil), u.requests...)
}

// Authorizations returns the Authorization headers received so far.
func (u *Upstream) Authorizations() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.auth...)
}

func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req map[string]any
	_ = json.Unmarshal(body, &req)
	u.mu.Lock()
	u.requests = append(u.requests, req)
	u.auth = append(u.auth, r.Header.Get("Authorization"))
	var step Step
	if len(u.steps) == 0 {
		step = Step{Status: 500, ErrorMessage: "no scripted response"}
	} else {
		step, u.steps = u.steps[0], u.steps[1:]
	}
	u.mu.Unlock()

	if step.Status != 0 && step.Status != http.StatusOK {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(step.Status)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": step.ErrorMessage, "type": "server_error"}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fl.Flush()
	for _, c := range step.Chunks {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", c); err != nil {
			return
		}
		fl.Flush()
	}
	switch {
	case step.EndWithoutDone:
	case step.Hang:
		<-r.Context().Done()
	case step.CloseMidStream:
		// Hijack and close, so the client sees the body end abruptly.
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
			}
		}
	default:
		fmt.Fprint(w, "data: [DONE]\n\n")
		fl.Flush()
	}
}

func chunk(model string, choice map[string]any, usage map[string]any) string {
	c := map[string]any{"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": []any{}}
	if choice != nil {
		choice["index"] = 0
		if _, ok := choice["finish_reason"]; !ok {
			choice["finish_reason"] = nil
		}
		c["choices"] = []any{choice}
	}
	if usage != nil {
		c["usage"] = usage
	}
	b, _ := json.Marshal(c)
	return string(b)
}

// Text is a content delta.
func Text(model, s string) string {
	return chunk(model, map[string]any{"delta": map[string]any{"content": s}}, nil)
}

// Reasoning is a reasoning delta in the named non-standard field
// ("reasoning" or "reasoning_content").
func Reasoning(model, field, s string) string {
	return chunk(model, map[string]any{"delta": map[string]any{field: s}}, nil)
}

// ToolCallStart opens tool call index with its id, name and first piece of
// arguments.
func ToolCallStart(model string, index int, id, name, args string) string {
	return chunk(model, map[string]any{"delta": map[string]any{"tool_calls": []any{map[string]any{
		"index": index, "id": id, "type": "function", "function": map[string]any{"name": name, "arguments": args},
	}}}}, nil)
}

// ToolCallArgs continues tool call index's arguments.
func ToolCallArgs(model string, index int, args string) string {
	return chunk(model, map[string]any{"delta": map[string]any{"tool_calls": []any{map[string]any{
		"index": index, "function": map[string]any{"arguments": args},
	}}}}, nil)
}

// Finish is the chunk carrying finish_reason.
func Finish(model, reason string) string {
	return chunk(model, map[string]any{"delta": map[string]any{}, "finish_reason": reason}, nil)
}

// Usage is the final usage chunk (empty choices). cached < 0 and cost < 0
// leave those fields out.
func Usage(model string, prompt, completion, cached int, cost float64) string {
	u := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
	if cached >= 0 {
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": cached}
	}
	if cost >= 0 {
		u["cost"] = cost
	}
	return chunk(model, nil, u)
}

// Answer is a complete streamed text answer: the pieces, a stop finish and
// usage without cache or cost details.
func Answer(model string, prompt, completion int, pieces ...string) Step {
	var cs []string
	for _, p := range pieces {
		cs = append(cs, Text(model, p))
	}
	cs = append(cs, Finish(model, "stop"), Usage(model, prompt, completion, -1, -1))
	return Step{Chunks: cs}
}

// Call is a complete streamed answer made of one tool call.
func Call(model, id, name, args string) Step {
	return Step{Chunks: []string{ToolCallStart(model, 0, id, name, args), Finish(model, "tool_calls"), Usage(model, 10, 5, -1, -1)}}
}

// Client is an ACP client that records session updates and answers
// permission requests and elicitations with the functions set on it.
type Client struct {
	mu      sync.Mutex
	updates []acp.SessionNotification
	perms   []acp.RequestPermissionRequest
	elicits []acp.UnstableCreateElicitationRequest

	// OnPermission answers session/request_permission; it cancels when nil.
	OnPermission func(ctx context.Context, p acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error)
	// OnElicit answers elicitation/create; it declines when nil.
	OnElicit func(ctx context.Context, p acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error)
}

// Select answers a permission request with the option id.
func Select(id string) func(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	return func(context.Context, acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected(acp.PermissionOptionId(id))}, nil
	}
}

// Updates returns the session updates received so far.
func (c *Client) Updates() []acp.SessionNotification {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]acp.SessionNotification(nil), c.updates...)
}

// Reset forgets recorded updates and requests.
func (c *Client) Reset() {
	c.mu.Lock()
	c.updates, c.perms, c.elicits = nil, nil, nil
	c.mu.Unlock()
}

// Permissions returns the permission requests received so far.
func (c *Client) Permissions() []acp.RequestPermissionRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]acp.RequestPermissionRequest(nil), c.perms...)
}

// Elicitations returns the elicitation requests received so far.
func (c *Client) Elicitations() []acp.UnstableCreateElicitationRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]acp.UnstableCreateElicitationRequest(nil), c.elicits...)
}

// Text joins the agent_message_chunk texts received so far.
func (c *Client) Text() string { return c.join(false) }

// Thought joins the agent_thought_chunk texts received so far.
func (c *Client) Thought() string { return c.join(true) }

func (c *Client) join(thought bool) string {
	var b strings.Builder
	for _, u := range c.Updates() {
		switch {
		case !thought && u.Update.AgentMessageChunk != nil && u.Update.AgentMessageChunk.Content.Text != nil:
			b.WriteString(u.Update.AgentMessageChunk.Content.Text.Text)
		case thought && u.Update.AgentThoughtChunk != nil && u.Update.AgentThoughtChunk.Content.Text != nil:
			b.WriteString(u.Update.AgentThoughtChunk.Content.Text.Text)
		}
	}
	return b.String()
}

// SessionUpdate implements acp.Client.
func (c *Client) SessionUpdate(ctx context.Context, n acp.SessionNotification) error {
	c.mu.Lock()
	c.updates = append(c.updates, n)
	c.mu.Unlock()
	return nil
}

// RequestPermission implements acp.Client.
func (c *Client) RequestPermission(ctx context.Context, p acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	c.mu.Lock()
	c.perms = append(c.perms, p)
	f := c.OnPermission
	c.mu.Unlock()
	if f == nil {
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeCancelled()}, nil
	}
	return f(ctx, p)
}

// UnstableCreateElicitation implements the client side of elicitation/create.
func (c *Client) UnstableCreateElicitation(ctx context.Context, p acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error) {
	c.mu.Lock()
	c.elicits = append(c.elicits, p)
	f := c.OnElicit
	c.mu.Unlock()
	if f == nil {
		return acp.NewUnstableCreateElicitationResponseDecline(), nil
	}
	return f(ctx, p)
}

var errUnsupported = errors.New("not supported by the test client")

// ReadTextFile implements acp.Client.
func (c *Client) ReadTextFile(context.Context, acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return acp.ReadTextFileResponse{}, errUnsupported
}

// WriteTextFile implements acp.Client.
func (c *Client) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return acp.WriteTextFileResponse{}, errUnsupported
}

// CreateTerminal implements acp.Client.
func (c *Client) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, errUnsupported
}

// KillTerminal implements acp.Client.
func (c *Client) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, errUnsupported
}

// TerminalOutput implements acp.Client.
func (c *Client) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, errUnsupported
}

// ReleaseTerminal implements acp.Client.
func (c *Client) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, errUnsupported
}

// WaitForTerminalExit implements acp.Client.
func (c *Client) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, errUnsupported
}

// Initialize is the initialize request a Cohort daemon sends: protocol
// version 1 and form elicitation.
func Initialize() acp.InitializeRequest {
	return acp.InitializeRequest{
		ProtocolVersion:    acp.ProtocolVersionNumber,
		ClientInfo:         &acp.Implementation{Name: "agenttest", Version: "0"},
		ClientCapabilities: acp.ClientCapabilities{Elicitation: &acp.ElicitationCapabilities{Form: &acp.ElicitationFormCapabilities{}}},
	}
}
