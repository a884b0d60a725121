package e2e_test

import (
	"io"
	"strings"
	"testing"
	"time"
)

// serve's timing settings reach the chat streams and the local interns:
// a short keepalive shows in a slow turn, and a short interaction deadline
// ends a paused run before its late answer.
func TestServeTimingSettings(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	c := &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	gw := c.Gateway(t, "--provisioner", "local", "--chat-keepalive", "200ms", "--interaction-deadline", "1s")
	c.load(t)
	res := chat(t, gw, c.WK, c.Demo, user("$ sleep 1; echo slept"))
	raw, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != 200 || !strings.Contains(string(raw), ": keepalive") || !strings.Contains(string(raw), "slept") {
		t.Fatalf("slow turn with a 200ms keepalive: %d %v\n%s", res.StatusCode, err, raw)
	}
	p := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ echo late", `"approval_mode":"manual"`)))
	if p.Finish != "tool_calls" {
		t.Fatalf("no pause: %q", p.Finish)
	}
	time.Sleep(2 * time.Second) // past the 1s deadline the local intern was given
	refusal(t, chat(t, gw, c.WK, c.Demo, p.answer("allow_once")), 409, "interaction_not_pending")
}
