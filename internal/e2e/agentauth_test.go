package e2e_test

import (
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// authAgent builds testdata/authagent once.
func authAgent(t *testing.T) string {
	return builds.Binary(t, "github.com/cohort-dev/cohort/internal/e2e/testdata/authagent")
}

// An agent that requires ACP authentication, through the real gateway and
// a jailed daemon (issue 29): with the operator's --agent-auth-method the
// daemon authenticates and the turn runs; without it the caller reads the
// agent's own demand in the 502 (docs/agents.md, "When an agent fails"),
// with the key the agent repeated redacted.
func TestAgentAuthentication(t *testing.T) {
	t.Parallel()
	bin := authAgent(t)
	const realKey = "sk-gateway-model-key-canary-0123456789"
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"configured", []string{"--agent-auth-method", "authy=test-login"}},
		{"unconfigured", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			c := &cluster{dataDir: dir, dbArgs: []string{"--data-dir", dir}}
			gw := c.GatewayEnv(t, []string{"COHORT_AGENT_API_KEY=" + realKey},
				append([]string{"--provisioner", "local", "--agent", "authy=" + bin, "--jail-ro-bind", filepath.Dir(bin)}, tc.args...)...)
			c.load(t)
			in := createInternWith(t, gw, c.WK, `{"name":"authy","agent":"authy"}`)["id"]

			var status int
			var body []byte
			testutil.Eventually(t, wait, "the intern is awake", func() bool {
				res := chat(t, gw, c.WK, in, user("hello auth"))
				defer res.Body.Close()
				if res.StatusCode == 409 || res.StatusCode == 503 {
					return false
				}
				status = res.StatusCode
				if status != 200 {
					body, _ = io.ReadAll(res.Body)
					return true
				}
				s := readAll(t, res)
				if s.Finish != "stop" || s.Text != "authenticated: hello auth" {
					t.Fatalf("authenticated turn: finish %q text %q error %v", s.Finish, s.Text, s.Error)
				}
				return true
			})
			if tc.args != nil {
				if status != 200 {
					t.Fatalf("with the auth method configured: %d %s", status, body)
				}
				return
			}
			var e struct {
				Error struct {
					Code     int    `json:"code"`
					Message  string `json:"message"`
					Metadata struct {
						Reason string `json:"reason"`
					} `json:"metadata"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || status != 502 || e.Error.Code != 502 || e.Error.Metadata.Reason != "turn_failed" {
				t.Fatalf("without the auth method: want 502 turn_failed, got %d %s", status, body)
			}
			msg := e.Error.Message
			if !strings.Contains(msg, "the agent refused a new session: Authentication required: call authenticate with method test-login first (key [redacted])") {
				t.Fatalf("message %q lacks the agent's demand, its key redacted", msg)
			}
			for _, secret := range []string{realKey, agents.KeyPlaceholder} {
				if strings.Contains(string(body), secret) || strings.Contains(gw.stderr.String(), secret) {
					t.Fatalf("%q reached the caller or the log:\n%s", secret, body)
				}
			}
		})
	}
}
