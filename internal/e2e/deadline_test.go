package e2e_test

import (
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
)

// TestStalledAgentFirstEventTimeout: the real daemon sends Started as soon as
// it takes the turn; the built-in agent then waits on a model that never
// answers. The gateway's first-event timeout counts the agent's first event,
// so the caller gets a plain 504 timeout at the bound, not an open stream.
func TestStalledAgentFirstEventTimeout(t *testing.T) {
	c, gw := newCluster(t, "", "--first-event-timeout", "2s")
	up := agenttest.NewUpstream(t, agenttest.Step{Hang: true})
	d := c.Daemon(t, c.NewIntern(t, "stalled"), upstreamEnv(up), "--model", upModel)
	began := time.Now()
	refusal(t, chat(t, gw, c.WK, d.id, user("stall")), 504, "timeout")
	if took := time.Since(began); took < 2*time.Second || took > 20*time.Second {
		t.Errorf("refused after %v, want the 2s bound", took)
	}
}

// TestApprovedCommandOutlastsTheBudget: a command approved in manual mode
// that runs longer than the first-event budget keeps its stream (the real
// daemon and built-in agent): the answer opens it at once, keepalives hold
// it, and the command's result ends it.
func TestApprovedCommandOutlastsTheBudget(t *testing.T) {
	c, gw := newCluster(t, "", "--first-event-timeout", "1s", "--chat-keepalive", "500ms")
	d := c.Daemon(t, c.NewIntern(t, "slow-approved"), nil)
	p := readAll(t, chat(t, gw, c.WK, d.id, user("$ sleep 5; echo approved-$((40+2))", `"approval_mode":"manual"`)))
	if p.Finish != "tool_calls" {
		t.Fatalf("no pause: %q %q", p.Finish, p.Text)
	}
	began := time.Now()
	res := chat(t, gw, c.WK, d.id, p.answer("allow_once"))
	// Before the command ends, which is all a loaded machine lets a test say.
	if opened := time.Since(began); opened > 4*time.Second {
		t.Errorf("the stream opened after %v, when the command ended", opened)
	}
	s := readAll(t, res)
	if s.Finish != "stop" || !strings.Contains(s.Text, "approved-42") {
		t.Fatalf("want the command's result, got %q %q %v", s.Finish, s.Text, s.Error)
	}
}
