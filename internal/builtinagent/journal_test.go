package builtinagent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"

	"github.com/cohort-dev/cohort/internal/builtinagent"
)

// replayed loads session id in a new agent on state and returns the
// conversation it replays ("user:…", "agent:…").
func replayed(t *testing.T, state string, id acp.SessionId) (*harness, []string) {
	t.Helper()
	h := start(t, builtinagent.Config{StateDir: state}, nil)
	h.client.Reset()
	if _, err := h.conn.LoadSession(context.Background(), acp.LoadSessionRequest{SessionId: id, Cwd: h.dir, McpServers: []acp.McpServer{}}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, u := range h.client.Updates() {
		switch {
		case u.Update.UserMessageChunk != nil:
			out = append(out, "user:"+u.Update.UserMessageChunk.Content.Text.Text)
		case u.Update.AgentMessageChunk != nil:
			out = append(out, "agent:"+strings.TrimPrefix(u.Update.AgentMessageChunk.Content.Text.Text, "Hello from cohort/demo. You said: "))
		}
	}
	h.session = id
	h.client.Reset()
	return h, out
}

// TestSessionJournal: a session's history is appended to its journal turn
// by turn; a save cut short by a crash (a last line without its newline)
// is left out and cut off, so the turns after it load whole; a session in
// the whole-file format of earlier agents still loads and goes on.
func TestSessionJournal(t *testing.T) {
	state := t.TempDir()
	h := start(t, builtinagent.Config{StateDir: state}, nil)
	h.mustPrompt(t, "one", builtinagent.ModeManual)
	h.mustPrompt(t, "two", builtinagent.ModeManual)
	journal := filepath.Join(state, string(h.session)+".jsonl")
	b, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	// session/new, then one save per prompt, each with only what is new.
	if n := strings.Count(string(b), "\n"); n != 3 || strings.Count(string(b), `"one"`) != 1 {
		t.Fatalf("journal of %d lines:\n%s", n, b)
	}

	f, err := os.OpenFile(journal, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"model":"cohort/demo","cwd":"/","from":4,"add":[{"role":"user","con`)
	f.Close()
	h2, got := replayed(t, state, h.session)
	if strings.Join(got, "|") != "user:one|agent:one|user:two|agent:two" {
		t.Fatalf("after a torn save: %v", got)
	}
	h2.mustPrompt(t, "three", builtinagent.ModeManual)
	if _, got = replayed(t, state, h.session); strings.Join(got, "|") != "user:one|agent:one|user:two|agent:two|user:three|agent:three" {
		t.Fatalf("after the torn save was cut off: %v", got)
	}

	// The format of earlier agents: <id>.json, the whole session.
	old := acp.SessionId("sess_0123456789abcdef0123456789abcdef")
	os.WriteFile(filepath.Join(state, string(old)+".json"),
		[]byte(`{"model":"cohort/demo","cwd":"/","history":[{"role":"user","content":"before"},{"role":"assistant","content":"Hello from cohort/demo. You said: before"}]}`), 0o600)
	h3, got := replayed(t, state, old)
	if strings.Join(got, "|") != "user:before|agent:before" {
		t.Fatalf("whole-file session: %v", got)
	}
	h3.mustPrompt(t, "after", builtinagent.ModeManual)
	if _, got = replayed(t, state, old); strings.Join(got, "|") != "user:before|agent:before|user:after|agent:after" {
		t.Fatalf("whole-file session, a turn later: %v", got)
	}
}
