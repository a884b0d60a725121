package internd_test

import (
	"net/http"
	"strings"
	"testing"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/internd"
)

const (
	testModelKey = "sk-test-model-key-0123456789"
	// testFileKey stands for a key the agent read from a config file: it
	// is in AgentKeys, and in an environment variable whose name does not
	// say key only so that the test agent can echo it.
	testFileKey = "cfg-file-key-9876543210"
)

// An agent's refusal reaches the caller in the agent's own words (issue 29),
// without the daemon's secrets and within a bound.
func TestAgentRefusalReachesCaller(t *testing.T) {
	for _, tc := range []struct{ mode, want string }{
		{"refuse", "the agent refused a new session: Authentication required: call authenticate with method chatgpt first; model gpt-9 is not available"},
		{"refuseinit", "the agent refused initialize: Unsupported client: upgrade cohort"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			e := newEnv(t, func(c *internd.Config) {
				cmd, agentEnv := agentCommand(tc.mode)
				c.AgentCommand, c.AgentEnv = cmd, append(agentEnv, "OPENAI_API_KEY="+testModelKey, "INTERND_TEST_ECHO="+testFileKey)
				c.AgentKeys = []string{testFileKey}
			})
			_, err := e.start(t, "", "hello", pb.ApprovalMode_APPROVAL_MODE_SELF_DRIVE)
			wantErr(t, err, http.StatusBadGateway, "turn_failed")
			msg := apierr.FromConnect(err).Message
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("message %q lacks the agent's words %q", msg, tc.want)
			}
			if strings.Contains(msg, testModelKey) || strings.Contains(msg, testFileKey) || !strings.Contains(msg, "[redacted]") {
				t.Fatalf("message %q carries the model key", msg)
			}
			if len(msg) > 500 {
				t.Fatalf("message not bounded: %d bytes", len(msg))
			}
		})
	}
}

// An agent that advertises an auth method and requires it: without the
// operator's method the caller reads the agent's demand; with it the daemon
// authenticates before session/new and the turn runs.
func TestAgentAuthenticate(t *testing.T) {
	cmd, agentEnv := agentCommand("auth")
	bare := newEnv(t, func(c *internd.Config) { c.AgentCommand, c.AgentEnv = cmd, agentEnv })
	_, err := bare.start(t, "", "hello", pb.ApprovalMode_APPROVAL_MODE_SELF_DRIVE)
	wantErr(t, err, http.StatusBadGateway, "turn_failed")
	if msg := apierr.FromConnect(err).Message; !strings.Contains(msg, "call authenticate with method test-login") {
		t.Fatalf("message %q lacks the agent's demand", msg)
	}
	authed := newEnv(t, func(c *internd.Config) {
		c.AgentCommand, c.AgentEnv, c.AgentAuthMethod = cmd, agentEnv, "test-login"
	})
	evs, err := authed.start(t, "", "hello", pb.ApprovalMode_APPROVAL_MODE_SELF_DRIVE)
	mustOK(t, err)
	if f := finish(t, evs); f.GetReason() != pb.Finished_REASON_STOP {
		t.Fatalf("authenticated turn: %v", f)
	}
}
