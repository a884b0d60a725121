package e2e_test

import (
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/agent/agenttest"
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
