package e2e_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// stream is a chat stream read by a strict SSE parser: every event is one
// `data:` line and a blank line (or the `: keepalive` comment), chunks obey
// the spec's shape and order, and nothing follows `data: [DONE]`.
type stream struct {
	t  testing.TB
	br *bufio.Reader

	Chunks    []map[string]any
	Text      string
	Reasoning string
	Finish    string         // finish_reason of the finish chunk
	ToolCall  map[string]any // the service.provide_input entry
	Args      map[string]any // its decoded arguments
	Error     map[string]any // the error object of an error finish
	Session   any            // session_id of the final chunk (string or nil)
	Usage     any            // usage of the final chunk
	Final     bool           // the final chunk arrived
	Done      bool           // [DONE] arrived
}

// open checks the response is a stream and returns its reader.
func open(t testing.TB, res *http.Response) *stream {
	t.Helper()
	if res.StatusCode != 200 {
		raw, _ := io.ReadAll(res.Body)
		t.Fatalf("want a stream, got %d: %s", res.StatusCode, raw)
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q", ct)
	}
	return &stream{t: t, br: bufio.NewReader(res.Body)}
}

// readAll reads the stream to its end, checking its shape.
func readAll(t testing.TB, res *http.Response) *stream {
	t.Helper()
	s := open(t, res)
	for {
		ok, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
	}
	if !s.Done {
		t.Fatalf("stream ended without [DONE]: %v", s.Chunks)
	}
	return s
}

// until reads chunks until cond holds for the stream so far.
func (s *stream) until(cond func(*stream) bool) {
	s.t.Helper()
	for !cond(s) {
		ok, err := s.next()
		if err != nil {
			s.t.Fatal(err)
		}
		if !ok {
			s.t.Fatalf("stream ended before the condition held: %v", s.Chunks)
		}
	}
}

// next reads one event. It reports false at a clean end after [DONE], and
// an error for any deviation from the format.
func (s *stream) next() (bool, error) {
	for {
		line, err := s.br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" && s.Done {
				return false, nil
			}
			if errors.Is(err, io.EOF) && line == "" {
				return false, nil // a cut stream: the caller decides
			}
			return false, fmt.Errorf("read: %w (partial %q)", err, line)
		}
		if s.Done {
			return false, fmt.Errorf("data after [DONE]: %q", line)
		}
		blank, err := s.br.ReadString('\n')
		if err != nil || blank != "\n" {
			return false, fmt.Errorf("event %q not followed by a blank line (%q, %v)", line, blank, err)
		}
		if line == ": keepalive\n" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return false, fmt.Errorf("unexpected line %q", line)
		}
		data = strings.TrimSuffix(data, "\n")
		if data == "[DONE]" {
			if !s.Final {
				return false, errors.New("[DONE] before the final chunk")
			}
			s.Done = true
			return true, nil
		}
		return true, s.chunk(data)
	}
}

func (s *stream) chunk(data string) error {
	if s.Final {
		return fmt.Errorf("chunk after the final chunk: %s", data)
	}
	var c map[string]any
	dec := json.NewDecoder(strings.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&c); err != nil {
		return fmt.Errorf("chunk %s: %v", data, err)
	}
	if c["object"] != "chat.completion.chunk" {
		return fmt.Errorf("object: %s", data)
	}
	if m, _ := c["model"].(string); m == "" {
		return fmt.Errorf("model: %s", data)
	}
	id, _ := c["id"].(string)
	if !strings.HasPrefix(id, "chatcmpl-") {
		return fmt.Errorf("id: %s", data)
	}
	if len(s.Chunks) > 0 && (id != s.Chunks[0]["id"] || c["created"] != s.Chunks[0]["created"]) {
		return fmt.Errorf("id or created changed: %s", data)
	}
	s.Chunks = append(s.Chunks, c)
	choices, ok := c["choices"].([]any)
	if !ok {
		return fmt.Errorf("choices: %s", data)
	}
	_, hasErr := c["error"]
	if len(choices) == 0 {
		_, hasSession := c["session_id"]
		_, hasUsage := c["usage"]
		if s.Finish == "" || !hasSession || !hasUsage || hasErr {
			return fmt.Errorf("final chunk out of order or incomplete: %s", data)
		}
		s.Final, s.Session, s.Usage = true, c["session_id"], c["usage"]
		if s.Finish == "tool_calls" && s.Usage != nil {
			return fmt.Errorf("usage after tool_calls: %s", data)
		}
		return nil
	}
	if _, ok := c["session_id"]; ok {
		return fmt.Errorf("session_id before the final chunk: %s", data)
	}
	if len(choices) != 1 || s.Finish != "" {
		return fmt.Errorf("choice after the finish: %s", data)
	}
	ch := choices[0].(map[string]any)
	d, _ := ch["delta"].(map[string]any)
	if len(s.Chunks) == 1 && d["role"] != "assistant" {
		return fmt.Errorf("first chunk without role: %s", data)
	}
	if len(s.Chunks) > 1 && d["role"] != nil {
		return fmt.Errorf("role after the first chunk: %s", data)
	}
	if v, ok := d["content"].(string); ok {
		s.Text += v
	}
	if v, ok := d["reasoning"].(string); ok {
		s.Reasoning += v
	}
	if tc, ok := d["tool_calls"].([]any); ok {
		if len(tc) != 1 || s.ToolCall != nil {
			return fmt.Errorf("interaction chunk: %s", data)
		}
		s.ToolCall = tc[0].(map[string]any)
		f := s.ToolCall["function"].(map[string]any)
		if f["name"] != "service.provide_input" || s.ToolCall["type"] != "function" {
			return fmt.Errorf("tool call: %s", data)
		}
		if err := json.Unmarshal([]byte(f["arguments"].(string)), &s.Args); err != nil {
			return fmt.Errorf("arguments: %s", data)
		}
	}
	switch f := ch["finish_reason"].(type) {
	case nil:
		if hasErr {
			return fmt.Errorf("error key on a non-finish chunk: %s", data)
		}
	case string:
		s.Finish = f
		if (f == "error") != hasErr {
			return fmt.Errorf("error key and finish disagree: %s", data)
		}
		if f == "tool_calls" && s.ToolCall == nil {
			return fmt.Errorf("tool_calls finish without a tool call: %s", data)
		}
		if hasErr {
			s.Error = c["error"].(map[string]any)
			md, _ := s.Error["metadata"].(map[string]any)
			if _, ok := s.Error["code"].(json.Number); !ok || s.Error["message"] == "" || md["reason"] == nil {
				return fmt.Errorf("error object: %s", data)
			}
		}
	}
	return nil
}

// reason is the error chunk's "code reason", or "".
func (s *stream) reason() string {
	if s.Error == nil {
		return ""
	}
	return fmt.Sprintf("%v %v", s.Error["code"], s.Error["metadata"].(map[string]any)["reason"])
}

// answer echoes the tool call and answers it, as a client replying to a
// pause does.
func (s *stream) answer(content string, extra ...string) string {
	s.t.Helper()
	if s.ToolCall == nil || s.Session == nil {
		s.t.Fatalf("no pause to answer: %v", s.Chunks)
	}
	echo, _ := json.Marshal(s.ToolCall)
	sess, _ := json.Marshal(s.Session)
	id, _ := json.Marshal(s.ToolCall["id"])
	c, _ := json.Marshal(content)
	var b bytes.Buffer
	b.WriteString(`{"stream":true,"session_id":` + string(sess) + join(extra) + `,"messages":[`)
	b.WriteString(`{"role":"assistant","content":null,"tool_calls":[` + string(echo) + `]},`)
	b.WriteString(`{"role":"tool","tool_call_id":` + string(id) + `,"content":` + string(c) + `}]}`)
	return b.String()
}
