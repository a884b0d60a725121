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
	for _, p := range []string{"POST /v1/responses", "POST /responses"} {
		routes = append(routes, route{p, serveResponses})
	}
}

func serveResponses(s *Server, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Model        string          `json:"model"`
		Instructions string          `json:"instructions"`
		Input        json.RawMessage `json:"input"`
		Tools        []struct {
			Type  string `json:"type"`
			Name  string `json:"name"`
			Tools []struct {
				Name string `json:"name"`
			} `json:"tools"` // a namespace's (Codex's MCP servers)
		} `json:"tools"`
		Stream bool `json:"stream"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		writeJSON(w, map[string]any{"error": map[string]any{"message": "bad json", "type": "invalid_request_error"}})
		return
	}
	turn := Turn{Protocol: OpenAIResponses, Model: req.Model, System: req.Instructions, Header: r.Header.Clone(), Body: body}
	var input string
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
		Output  json.RawMessage `json:"output"`
	}
	if json.Unmarshal(req.Input, &input) == nil {
		turn.User = input
	} else {
		json.Unmarshal(req.Input, &items)
	}
	for _, it := range items {
		switch {
		case it.Type == "function_call_output" || it.Type == "custom_tool_call_output" || it.Type == "local_shell_call_output":
			turn.ToolResults = append(turn.ToolResults, responsesOutput(it.Output))
		case it.Role == "user" && (it.Type == "" || it.Type == "message"):
			turn.User, turn.ToolResults = responsesText(it.Content), nil
		case (it.Role == "system" || it.Role == "developer") && (it.Type == "" || it.Type == "message"):
			turn.System += responsesText(it.Content)
		}
	}
	for _, t := range req.Tools {
		turn.Tools = append(turn.Tools, cmpOr(t.Name, t.Type))
		for _, nt := range t.Tools {
			turn.Tools = append(turn.Tools, t.Name+"/"+nt.Name)
		}
	}
	reply := s.answer(turn)
	if reply.Status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(reply.Status)
		writeJSON(w, map[string]any{"error": map[string]any{"message": "scripted error", "type": "server_error"}})
		return
	}
	id := fmt.Sprintf("resp_%d", time.Now().UnixNano())
	var output []any
	if reply.Text != "" {
		output = append(output, map[string]any{"type": "message", "id": "msg_" + id, "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": reply.Text, "annotations": []any{}}}})
	}
	for _, c := range reply.Calls {
		item := map[string]any{"type": "function_call", "id": "fc_" + c.ID, "call_id": c.ID, "name": c.Name,
			"arguments": c.Arguments, "status": "completed"}
		if ns, name, ok := strings.Cut(c.Name, "/"); ok {
			item["namespace"], item["name"] = ns, name
		}
		output = append(output, item)
	}
	usage := map[string]any{"input_tokens": reply.InputTokens, "output_tokens": reply.OutputTokens,
		"total_tokens":         reply.InputTokens + reply.OutputTokens,
		"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}
	response := func(status string, out []any) map[string]any {
		r := map[string]any{"id": id, "object": "response", "created_at": time.Now().Unix(), "status": status, "model": req.Model, "output": out}
		if status == "completed" {
			r["usage"] = usage
		}
		return r
	}
	if !req.Stream {
		writeJSON(w, response("completed", output))
		return
	}
	sse := newSSE(w)
	seq := 0
	ev := func(name string, v map[string]any) {
		v["type"], v["sequence_number"] = name, seq
		seq++
		sse.event(name, v)
	}
	ev("response.created", map[string]any{"response": response("in_progress", []any{})})
	for i, item := range output {
		m := item.(map[string]any)
		added := map[string]any{}
		for k, v := range m {
			added[k] = v
		}
		added["status"] = "in_progress"
		if m["type"] == "message" {
			added["content"] = []any{}
			ev("response.output_item.added", map[string]any{"output_index": i, "item": added})
			ev("response.content_part.added", map[string]any{"item_id": m["id"], "output_index": i, "content_index": 0,
				"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
			ev("response.output_text.delta", map[string]any{"item_id": m["id"], "output_index": i, "content_index": 0, "delta": reply.Text})
			ev("response.output_text.done", map[string]any{"item_id": m["id"], "output_index": i, "content_index": 0, "text": reply.Text})
			ev("response.content_part.done", map[string]any{"item_id": m["id"], "output_index": i, "content_index": 0,
				"part": map[string]any{"type": "output_text", "text": reply.Text, "annotations": []any{}}})
		} else {
			added["arguments"] = ""
			ev("response.output_item.added", map[string]any{"output_index": i, "item": added})
			ev("response.function_call_arguments.delta", map[string]any{"item_id": m["id"], "output_index": i, "delta": m["arguments"]})
			ev("response.function_call_arguments.done", map[string]any{"item_id": m["id"], "output_index": i, "arguments": m["arguments"]})
		}
		ev("response.output_item.done", map[string]any{"output_index": i, "item": m})
	}
	ev("response.completed", map[string]any{"response": response("completed", output)})
}

// responsesText joins the text parts of an input message's content.
func responsesText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	json.Unmarshal(raw, &parts)
	var b []string
	for _, p := range parts {
		b = append(b, p.Text)
	}
	return strings.Join(b, "\n")
}

// responsesOutput reads a tool output: a string, or parts, or an object
// with an "output" or "content" field.
func responsesOutput(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if t := responsesText(raw); t != "" {
		return t
	}
	return string(raw)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
