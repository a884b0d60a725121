package modelserver

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

func init() {
	for _, p := range []string{"POST /v1/chat/completions", "POST /chat/completions"} {
		routes = append(routes, route{p, serveOpenAIChat})
	}
	for _, p := range []string{"GET /v1/models", "GET /models"} {
		routes = append(routes, route{p, serveModels})
	}
}

// chatRequest is the part of a Chat Completions request scripts decide on.
type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	Stream bool `json:"stream"`
}

// text reads a message content: a string or an array of parts.
func text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

func serveOpenAIChat(s *Server, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	turn := Turn{Protocol: OpenAIChat, Model: req.Model, Header: r.Header.Clone(), Body: body}
	for _, m := range req.Messages {
		switch m.Role {
		case "system", "developer":
			turn.System += text(m.Content)
		case "user":
			turn.User, turn.ToolResults = text(m.Content), nil
		case "tool":
			turn.ToolResults = append(turn.ToolResults, text(m.Content))
		}
	}
	for _, t := range req.Tools {
		turn.Tools = append(turn.Tools, t.Function.Name)
	}
	reply := s.answer(turn)
	if reply.Status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(reply.Status)
		fmt.Fprintf(w, `{"error":{"message":"scripted error","type":"server_error"}}`)
		return
	}
	id := fmt.Sprintf("chatcmpl-%d", time.Now().UnixNano())
	created := time.Now().Unix()
	chunk := func(delta map[string]any, finish any, usage any) map[string]any {
		c := map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
		if usage != nil {
			c["usage"] = usage
		}
		return c
	}
	if !req.Stream {
		msg := map[string]any{"role": "assistant", "content": reply.Text}
		finish := "stop"
		if len(reply.Calls) > 0 {
			msg["tool_calls"], finish = chatToolCalls(reply.Calls, false), "tool_calls"
		}
		writeJSON(w, map[string]any{"id": id, "object": "chat.completion", "created": created, "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
			"usage":   chatUsage(reply)})
		return
	}
	sse := newSSE(w)
	sse.data(chunk(map[string]any{"role": "assistant", "content": ""}, nil, nil))
	if reply.Text != "" {
		sse.data(chunk(map[string]any{"content": reply.Text}, nil, nil))
	}
	finish := "stop"
	if len(reply.Calls) > 0 {
		sse.data(chunk(map[string]any{"tool_calls": chatToolCalls(reply.Calls, true)}, nil, nil))
		finish = "tool_calls"
	}
	sse.data(chunk(map[string]any{}, finish, nil))
	// The usage chunk (stream_options.include_usage): empty choices.
	sse.data(map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": req.Model,
		"choices": []any{}, "usage": chatUsage(reply)})
	sse.raw("data: [DONE]\n\n")
}

func chatToolCalls(calls []Call, indexed bool) []any {
	var out []any
	for i, c := range calls {
		tc := map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments}}
		if indexed {
			tc["index"] = i
		}
		out = append(out, tc)
	}
	return out
}

func chatUsage(r Reply) map[string]any {
	return map[string]any{"prompt_tokens": r.InputTokens, "completion_tokens": r.OutputTokens, "total_tokens": r.InputTokens + r.OutputTokens}
}

func serveModels(s *Server, w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]any{"object": "list", "data": []any{}})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// sseWriter writes server-sent events, flushing each.
type sseWriter struct {
	w http.ResponseWriter
	f http.Flusher
}

func newSSE(w http.ResponseWriter) *sseWriter {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	return &sseWriter{w: w, f: f}
}

func (s *sseWriter) raw(p string) {
	io.WriteString(s.w, p)
	if s.f != nil {
		s.f.Flush()
	}
}

func (s *sseWriter) data(v any) {
	b, _ := json.Marshal(v)
	s.raw("data: " + string(b) + "\n\n")
}

// event writes a named event (Anthropic, Responses).
func (s *sseWriter) event(name string, v any) {
	b, _ := json.Marshal(v)
	s.raw("event: " + name + "\ndata: " + string(b) + "\n\n")
}
