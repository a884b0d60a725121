package modelserver

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
)

func init() {
	for _, v := range []string{"v1beta", "v1"} {
		routes = append(routes, route{"POST /" + v + "/models/{call}", serveGemini})
	}
}

// serveGemini answers models/{model}:streamGenerateContent (SSE),
// :generateContent and :countTokens.
func serveGemini(s *Server, w http.ResponseWriter, r *http.Request) {
	model, method, _ := strings.Cut(r.PathValue("call"), ":")
	body, _ := io.ReadAll(r.Body)
	if method == "countTokens" {
		writeJSON(w, map[string]any{"totalTokens": 10})
		return
	}
	var req struct {
		Contents []struct {
			Role  string       `json:"role"`
			Parts []geminiPart `json:"parts"`
		} `json:"contents"`
		SystemInstruction *struct {
			Parts []geminiPart `json:"parts"`
		} `json:"systemInstruction"`
		Tools []struct {
			FunctionDeclarations []struct {
				Name string `json:"name"`
			} `json:"functionDeclarations"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		writeJSON(w, map[string]any{"error": map[string]any{"code": 400, "message": "bad json", "status": "INVALID_ARGUMENT"}})
		return
	}
	turn := Turn{Protocol: Gemini, Model: model, Header: r.Header.Clone(), Body: body}
	if req.SystemInstruction != nil {
		for _, p := range req.SystemInstruction.Parts {
			turn.System += p.Text
		}
	}
	for _, c := range req.Contents {
		if c.Role != "user" && c.Role != "" {
			continue
		}
		var text []string
		results := false
		for _, p := range c.Parts {
			if p.FunctionResponse != nil {
				results = true
				turn.ToolResults = append(turn.ToolResults, geminiResponseText(p.FunctionResponse.Response))
			} else if p.Text != "" {
				text = append(text, p.Text)
			}
		}
		if !results {
			turn.User, turn.ToolResults = strings.Join(text, "\n"), nil
		}
	}
	for _, t := range req.Tools {
		for _, f := range t.FunctionDeclarations {
			turn.Tools = append(turn.Tools, f.Name)
		}
	}
	reply := s.answer(turn)
	if reply.Status != 0 {
		w.WriteHeader(reply.Status)
		writeJSON(w, map[string]any{"error": map[string]any{"code": reply.Status, "message": "scripted error", "status": "INTERNAL"}})
		return
	}
	var parts []any
	if reply.Text != "" {
		parts = append(parts, map[string]any{"text": reply.Text})
	}
	for _, c := range reply.Calls {
		parts = append(parts, map[string]any{"functionCall": map[string]any{"name": c.Name, "args": json.RawMessage(c.Arguments)}})
	}
	res := map[string]any{
		"candidates": []any{map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}},
		"usageMetadata": map[string]any{"promptTokenCount": reply.InputTokens, "candidatesTokenCount": reply.OutputTokens,
			"totalTokenCount": reply.InputTokens + reply.OutputTokens},
		"modelVersion": model,
	}
	if method != "streamGenerateContent" {
		writeJSON(w, res)
		return
	}
	newSSE(w).data(res)
}

type geminiPart struct {
	Text             string `json:"text"`
	FunctionResponse *struct {
		Name     string          `json:"name"`
		Response json.RawMessage `json:"response"`
	} `json:"functionResponse"`
}

// geminiResponseText reads a function response: its "output" (or
// "content", or the whole object).
func geminiResponseText(raw json.RawMessage) string {
	var m map[string]any
	if json.Unmarshal(raw, &m) == nil {
		for _, k := range []string{"output", "content", "llmContent"} {
			if s, ok := m[k].(string); ok {
				return s
			}
		}
	}
	return string(raw)
}
