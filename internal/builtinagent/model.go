package builtinagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// Message is one entry of a session's conversation, in the shape of the
// chat-completions API (roles system, user, assistant, tool).
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

// ToolCall is a complete function call the model asked for.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ToolSpec describes a tool offered to the model.
type ToolSpec struct {
	Name        string
	Description string
	Parameters  map[string]any
}

// ModelRequest is one model call.
type ModelRequest struct {
	Model    string
	Messages []Message
	Tools    []ToolSpec
}

// Delta is a streamed piece of a model's answer.
type Delta struct {
	// Model is the model id the upstream reported on this piece.
	Model     string
	Text      string
	Reasoning string
}

// CallUsage is one model call's token usage, as the upstream reported it.
type CallUsage struct {
	PromptTokens     int64
	CompletionTokens int64
	TotalTokens      int64
	// CachedTokens is set when the upstream reported
	// prompt_tokens_details.cached_tokens.
	CachedTokens *int64
	// Cost (USD) is set when the upstream reported usage.cost.
	Cost *float64
}

// ModelResponse is the outcome of one complete model call.
type ModelResponse struct {
	Model     string
	Text      string
	ToolCalls []ToolCall
	// Usage is nil when the upstream reported none.
	Usage *CallUsage
}

// Model is a chat model the agent loop drives. Complete streams the answer
// through emit (which fails when the client is gone) and returns it whole.
type Model interface {
	Complete(ctx context.Context, req ModelRequest, emit func(Delta) error) (ModelResponse, error)
}

// UpstreamError is a model call that failed; Reason is the spec's reason the
// daemon maps it to (turn_failed or timeout).
type UpstreamError struct {
	Reason  string
	Message string
}

func (e *UpstreamError) Error() string { return e.Message }

// OpenAIModel calls an OpenAI-compatible chat-completions endpoint with
// streaming.
type OpenAIModel struct {
	client openai.Client
	// idle bounds the wait for the response headers and for each chunk.
	idle time.Duration
	// key is redacted from every error message, in case an upstream echoes it.
	key string
}

// OpenAIConfig configures an OpenAIModel.
type OpenAIConfig struct {
	BaseURL string
	APIKey  string
	// IdleTimeout bounds the wait for the first byte and between chunks.
	IdleTimeout time.Duration
	MaxRetries  int
	HTTPClient  *http.Client
}

// NewOpenAIModel returns a Model over an OpenAI-compatible endpoint.
func NewOpenAIModel(cfg OpenAIConfig) *OpenAIModel {
	opts := []option.RequestOption{
		option.WithAPIKey(cfg.APIKey),
		option.WithMaxRetries(cfg.MaxRetries),
		// The SDK would read OPENAI_* variables and add organization and
		// project headers; we pass everything explicitly.
		option.WithHeaderDel("OpenAI-Organization"),
		option.WithHeaderDel("OpenAI-Project"),
	}
	if cfg.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(cfg.BaseURL))
	}
	hc := http.Client{Transport: http.DefaultTransport}
	if cfg.HTTPClient != nil {
		hc = *cfg.HTTPClient
	}
	if hc.Transport == nil {
		hc.Transport = http.DefaultTransport
	}
	hc.Transport = oneWrite{hc.Transport}
	opts = append(opts, option.WithHTTPClient(&hc))
	idle := cfg.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	return &OpenAIModel{client: openai.NewClient(opts...), idle: idle, key: cfg.APIKey}
}

// oneWrite sends a request whose body is in memory with its headers in
// one write. openai-go wraps the body it holds (closeOnceReadCloser), and
// net/http flushes the headers on their own before a body it does not
// know to be in memory (transfer.go, issue 22088): two writes, each a
// round trip to the Sentry under gVisor's ptrace platform, on the way to
// every turn's first chunk (ADR 0996). The body is the SDK's GetBody, a
// fresh reader of the same bytes, which net/http recognises.
type oneWrite struct{ next http.RoundTripper }

func (o oneWrite) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.GetBody == nil || req.Body == nil || req.Body == http.NoBody || req.ContentLength <= 0 {
		return o.next.RoundTrip(req)
	}
	body, err := req.GetBody()
	if err != nil {
		return o.next.RoundTrip(req)
	}
	req.Body.Close() // a RoundTripper closes the body it was given
	r := *req
	r.Body = body
	return o.next.RoundTrip(&r)
}

// Complete implements Model.
func (m *OpenAIModel) Complete(ctx context.Context, req ModelRequest, emit func(Delta) error) (ModelResponse, error) {
	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The idle timer cancels the call when the upstream goes quiet; it is
	// reset on every chunk, so a long answer that keeps streaming is fine.
	var idleMu sync.Mutex
	idleFired := false
	timer := time.AfterFunc(m.idle, func() {
		idleMu.Lock()
		idleFired = true
		idleMu.Unlock()
		cancel()
	})
	defer timer.Stop()
	fired := func() bool { idleMu.Lock(); defer idleMu.Unlock(); return idleFired }

	body, err := requestBody(req)
	if err != nil {
		return ModelResponse{}, err
	}
	// openai-go makes the request (auth, retries, HTTP errors) with the
	// body encoded here: its own encoding of the params was a fifth of the
	// agent's CPU per turn (docs/benchmarks.md, issue 31). The event stream
	// it returns is read here too (stream.go): its generic chunk decoding
	// was the larger part of the agent's CPU per streamed chunk.
	var raw *http.Response
	stream := m.client.Chat.Completions.NewStreaming(callCtx, openai.ChatCompletionNewParams{},
		option.WithRequestBody("application/json", body), option.WithResponseInto(&raw))
	defer stream.Close()

	var resp ModelResponse
	var text strings.Builder
	type partial struct{ id, name, args strings.Builder }
	var calls []*partial
	finished := false
	out := mergedDeltas{emit: emit}
	err = stream.Err()
	if err == nil && raw != nil && raw.Body != nil {
		// Deltas that arrived together go out as one update: out holds
		// them while the next event is already buffered, and sends them
		// before any read that could wait.
		events := newEventReader(raw.Body, out.flush)
		var chunk streamChunk
		for {
			data, ok := events.next()
			if !ok {
				if events.hookErr != nil { // the client is gone
					resp.Text = text.String()
					return resp, events.hookErr
				}
				err = events.err
				break
			}
			if bytes.HasPrefix(data, []byte("[DONE]")) {
				break
			}
			timer.Reset(m.idle)
			if err = chunk.decode(data); err != nil {
				break
			}
			if chunk.Model != "" {
				resp.Model = chunk.Model
			}
			if chunk.Usage != nil {
				resp.Usage = chunk.Usage.read()
			}
			for i := range chunk.Choices {
				choice := &chunk.Choices[i]
				if choice.Index != 0 {
					continue
				}
				if choice.FinishReason != "" {
					finished = true
				}
				d := &choice.Delta
				text.WriteString(d.Content)
				if r := d.reasoning(); r != "" {
					err = out.add(resp.Model, r, true)
				}
				if err == nil && d.Content != "" {
					err = out.add(resp.Model, d.Content, false)
				}
				if err != nil {
					resp.Text = text.String()
					return resp, err
				}
				for _, tc := range d.ToolCalls {
					i := int(tc.Index)
					if i < 0 || i > 64 {
						continue
					}
					for len(calls) <= i {
						calls = append(calls, &partial{})
					}
					// Ids and names arrive once; arguments arrive in pieces.
					if tc.ID != "" && calls[i].id.Len() == 0 {
						calls[i].id.WriteString(tc.ID)
					}
					if tc.Function.Name != "" && calls[i].name.Len() == 0 {
						calls[i].name.WriteString(tc.Function.Name)
					}
					calls[i].args.WriteString(tc.Function.Arguments)
				}
			}
		}
		if ferr := out.flush(); ferr != nil && err == nil {
			resp.Text = text.String()
			return resp, ferr
		}
	}
	resp.Text = text.String()
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return resp, ctx.Err()
		case fired():
			return resp, &UpstreamError{Reason: "timeout", Message: fmt.Sprintf("model upstream timed out: nothing received for %s", m.idle)}
		}
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return resp, &UpstreamError{Reason: "turn_failed", Message: "model upstream closed the stream before the answer finished: " + err.Error()}
		}
		return resp, &UpstreamError{Reason: "turn_failed", Message: m.redact(upstreamMessage(err))}
	}
	if !finished {
		// The body ended without a finish_reason: the upstream hung up in the
		// middle of the answer, and a partial answer must not pass for a
		// complete one.
		return resp, &UpstreamError{Reason: "turn_failed", Message: "model upstream closed the stream before the answer finished"}
	}
	for i, c := range calls {
		id := c.id.String()
		if id == "" {
			id = fmt.Sprintf("call_%d", i)
		}
		resp.ToolCalls = append(resp.ToolCalls, ToolCall{ID: id, Name: c.name.String(), Arguments: c.args.String()})
	}
	return resp, nil
}

func (m *OpenAIModel) redact(s string) string {
	if m.key != "" {
		s = strings.ReplaceAll(s, m.key, "[redacted]")
	}
	return s
}

// upstreamMessage says what went wrong in words a client can act on,
// bounded, without the request dump the SDK's error string carries.
func upstreamMessage(err error) string {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		msg := strings.TrimSpace(apiErr.Message)
		if msg == "" {
			msg = http.StatusText(apiErr.StatusCode)
		}
		return truncate(fmt.Sprintf("model upstream returned HTTP %d: %s", apiErr.StatusCode, msg), 300)
	}
	return truncate("model upstream failed: "+err.Error(), 300)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// wireRequest is the body of a streamed chat completion request, as
// openai-go encodes its params: system, user and tool messages always carry
// their content, an assistant message only when it has some; every tool
// has a description.
type wireRequest struct {
	Messages      []wireMessage `json:"messages"`
	Model         string        `json:"model"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Tools  []wireTool `json:"tools,omitempty"`
	Stream bool       `json:"stream"`
}

type wireMessage struct {
	Content    *string        `json:"content,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	ToolCalls  []wireToolCall `json:"tool_calls,omitempty"`
	Role       string         `json:"role"`
}

type wireToolCall struct {
	ID       string `json:"id"`
	Function struct {
		Arguments string `json:"arguments"`
		Name      string `json:"name"`
	} `json:"function"`
	Type string `json:"type"`
}

type wireTool struct {
	Function struct {
		Name        string         `json:"name"`
		Description string         `json:"description"`
		Parameters  map[string]any `json:"parameters"`
	} `json:"function"`
	Type string `json:"type"`
}

// requestBody encodes req with encoding/json.
func requestBody(req ModelRequest) ([]byte, error) {
	w := wireRequest{Model: req.Model, Messages: make([]wireMessage, 0, len(req.Messages)), Stream: true}
	w.StreamOptions.IncludeUsage = true
	for i := range req.Messages {
		m := &req.Messages[i]
		var wm wireMessage
		switch m.Role {
		case "system", "user":
			wm = wireMessage{Role: m.Role, Content: &m.Content}
		case "tool":
			wm = wireMessage{Role: m.Role, Content: &m.Content, ToolCallID: m.ToolCallID}
		case "assistant":
			wm.Role = m.Role
			if m.Content != "" {
				wm.Content = &m.Content
			}
			for _, tc := range m.ToolCalls {
				c := wireToolCall{ID: tc.ID, Type: "function"}
				c.Function.Name, c.Function.Arguments = tc.Name, tc.Arguments
				wm.ToolCalls = append(wm.ToolCalls, c)
			}
		default:
			continue
		}
		w.Messages = append(w.Messages, wm)
	}
	for _, t := range req.Tools {
		wt := wireTool{Type: "function"}
		wt.Function.Name, wt.Function.Description, wt.Function.Parameters = t.Name, t.Description, t.Parameters
		w.Tools = append(w.Tools, wt)
	}
	return json.Marshal(w)
}
