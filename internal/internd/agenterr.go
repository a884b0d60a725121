package internd

import (
	"errors"
	"strings"
	"unicode"

	acp "github.com/coder/acp-go-sdk"

	"github.com/cohort-dev/cohort/internal/httptool"
)

// maxAgentMessage bounds how much of an agent's own error message reaches
// the caller: enough for "Authentication required: call authenticate with
// method … first", not a stack trace.
const maxAgentMessage = 300

// agentRedactor redacts what the daemon knows to be secret from an agent's
// words before they leave for the caller: the daemon's own bearer secret
// the model keys it was given (AgentKeys: placeholder or real), and every
// value of the agent's environment whose name says it is a key. Vault values never pass through the
// daemon's memory beyond one http_request, and the tool redacts them there.
func agentRedactor(cfg Config) *httptool.Redactor {
	r := &httptool.Redactor{}
	r.Add(cfg.Secret, "[redacted]")
	for _, k := range cfg.AgentKeys {
		r.Add(k, "[redacted]")
	}
	for _, kv := range cfg.AgentEnv {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || len(value) < 4 {
			continue
		}
		up := strings.ToUpper(name)
		for _, w := range []string{"KEY", "TOKEN", "SECRET", "PASSWORD", "AUTH", "CREDENTIAL"} {
			if strings.Contains(up, w) {
				r.Add(value, "[redacted]")
				break
			}
		}
	}
	return r
}

// agentMessage is the agent's own account of a failed ACP call, redacted,
// on one line and bounded; "" when the agent gave none worth passing on.
func (d *Daemon) agentMessage(err error) string {
	var re *acp.RequestError
	if !errors.As(err, &re) {
		return ""
	}
	msg := re.Message
	// JSON-RPC's generic texts say nothing; agents often put the real
	// reason in data (a string, or {"message"|"details": ...}).
	switch data := re.Data.(type) {
	case string:
		msg = joinMsg(msg, data)
	case map[string]any:
		for _, k := range []string{"message", "details", "error"} {
			if s, ok := data[k].(string); ok {
				msg = joinMsg(msg, s)
				break
			}
		}
	}
	msg = d.redact.Redact(msg)
	msg = strings.Join(strings.FieldsFunc(msg, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
	if len(msg) > maxAgentMessage {
		msg = truncate(msg, maxAgentMessage) + "…"
	}
	return msg
}

func joinMsg(a, b string) string {
	b = strings.TrimSpace(b)
	switch {
	case b == "" || strings.Contains(a, b):
		return a
	case a == "" || a == "Internal error" || a == "Invalid params" || a == "Invalid request":
		return b
	}
	return a + ": " + b
}

// advertises reports whether the agent offered the authentication method id
// in initialize; the daemon authenticates with no method it did not offer.
func advertises(methods []acp.AuthMethod, id string) bool {
	for _, m := range methods {
		switch {
		case m.Agent != nil && m.Agent.Id == id,
			m.EnvVar != nil && m.EnvVar.Id == id,
			m.Terminal != nil && m.Terminal.Id == id:
			return true
		}
	}
	return false
}
