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
	routes = append(routes, route{"POST /v1/messages", serveAnthropic},
		route{"POST /v1/messages/count_tokens", func(s *Server, w http.ResponseWriter, r *http.Request) {
			writeJSON(w, map[string]any{"input_tokens": 10})
		}})
}

// anthropicBlock is one content block of a Messages request.
type anthropicBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Content json.RawMessage `json:"content"` // tool_result: a string or blocks
}

// anthropicContent reads a message's content: a string or blocks.
func anthropicContent(raw json.RawMessage) []anthropicBlock {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []anthropicBlock{{Type: "text", Text: s}}
	}
	var blocks []anthropicBlock
	json.Unmarshal(raw, &blocks)
	return blocks
}

func serveAnthropic(s *Server, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Model    string          `json:"model"`
		System   json.RawMessage `json:"system"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
		Stream bool `json:"stream"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		writeJSON(w, map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error", "message": "bad json"}})
		return
	}
	turn := Turn{Protocol: Anthropic, Model: req.Model, Header: r.Header.Clone(), Body: body}
	if len(req.System) > 0 {
		for _, b := range anthropicContent(req.System) {
			turn.System += b.Text
		}
	}
	for _, m := range req.Messages {
		if m.Role != "user" {
			continue
		}
		blocks := anthropicContent(m.Content)
		results := false
		for _, b := range blocks {
			if b.Type == "tool_result" {
				results = true
				var out strings.Builder
				for _, c := range anthropicContent(b.Content) {
					out.WriteString(c.Text)
				}
				turn.ToolResults = append(turn.ToolResults, out.String())
			}
		}
		var text []string
		for _, b := range blocks {
			// Reminders and a search's "Tool loaded." beside results are not
			// a new prompt; a prompt beside them is (Claude Code sends the
			// result of a tool a cancel interrupted with the next prompt).
			if b.Type == "text" && !(results && notPrompt(b.Text)) {
				text = append(text, b.Text)
			}
		}
		if results && len(text) == 0 {
			continue
		}
		turn.User, turn.ToolResults = strings.Join(text, "\n"), nil
	}
	for _, t := range req.Tools {
		turn.Tools = append(turn.Tools, t.Name)
	}
	reply := s.answer(turn)
	if reply.Status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(reply.Status)
		writeJSON(w, map[string]any{"type": "error", "error": map[string]any{"type": "api_error", "message": "scripted error"}})
		return
	}
	id := fmt.Sprintf("msg_%d", time.Now().UnixNano())
	stop := "end_turn"
	if len(reply.Calls) > 0 {
		stop = "tool_use"
	}
	if !req.Stream {
		var content []any
		if reply.Text != "" {
			content = append(content, map[string]any{"type": "text", "text": reply.Text})
		}
		for _, c := range reply.Calls {
			content = append(content, map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": json.RawMessage(c.Arguments)})
		}
		writeJSON(w, map[string]any{"id": id, "type": "message", "role": "assistant", "model": req.Model, "content": content,
			"stop_reason": stop, "stop_sequence": nil,
			"usage": map[string]any{"input_tokens": reply.InputTokens, "output_tokens": reply.OutputTokens}})
		return
	}
	sse := newSSE(w)
	sse.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": req.Model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": reply.InputTokens, "output_tokens": 1}}})
	index := 0
	if reply.Text != "" {
		sse.event("content_block_start", map[string]any{"type": "content_block_start", "index": index, "content_block": map[string]any{"type": "text", "text": ""}})
		sse.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": index, "delta": map[string]any{"type": "text_delta", "text": reply.Text}})
		sse.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	for _, c := range reply.Calls {
		sse.event("content_block_start", map[string]any{"type": "content_block_start", "index": index,
			"content_block": map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": map[string]any{}}})
		sse.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": index,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": c.Arguments}})
		sse.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	sse.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": reply.OutputTokens}})
	sse.event("message_stop", map[string]any{"type": "message_stop"})
}

// notPrompt is the text Claude Code puts beside tool results of its own.
func notPrompt(text string) bool {
	text = strings.TrimSpace(text)
	return strings.HasPrefix(text, "<system-reminder>") || text == "Tool loaded."
}
