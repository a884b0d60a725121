// Package launch is what starts an intern's daemon and what it presents:
// the `cohort intern` settings a backend chooses (Daemon, encoded by Args
// and decoded by Flags, so the flag names live here only) and the
// credentials derived from the daemon secret. The backends import it
// without the daemon itself (ADR 0951).
package launch

import (
	"flag"
	"strconv"
	"strings"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/config"
)

// DefaultInteractionDeadline is how long a question waits for its answer
// when the daemon is given no --interaction-deadline.
const DefaultInteractionDeadline = 5 * time.Minute

// Daemon is one daemon's launch. A zero field is not passed, so the
// daemon's default (or its environment's value) holds; but for InternID
// and Model, always passed (an intern with no model has none, not the
// environment's).
type Daemon struct {
	// Listen is the address it serves on; ListenFD, when set, an
	// inherited listening socket it serves on instead.
	Listen   string
	ListenFD int
	// SecretFD, when set, is an inherited descriptor the secret is read
	// from (then closed); otherwise the daemon reads COHORT_INTERN_SECRET.
	// Descriptors are 3 and up: 0 means none.
	SecretFD int
	// DataDir holds the intern's sessions and is the agent's working
	// directory.
	DataDir, InternID, Model string
	// GatewayURL is the gateway's API base the http_request tool asks
	// for vault secrets.
	GatewayURL string
	// HTTPToolProxy is the proxy the http_request tool sends through (a
	// jail's egress relay); HTTPToolCAFile, certificates it also trusts.
	HTTPToolProxy, HTTPToolCAFile string
	LogLevel                      string
	InteractionDeadline           time.Duration
	RetainEvents, RetainBytes     int
	MaxPausedRuns                 int
	MaxPausedPerCaller            int
	SessionIdleTTL, InitTimeout   time.Duration
	Agent                         Agent
}

// Agent is which agent the daemon runs: Command, or the known third-party
// agent Name installed in Modules.
type Agent struct {
	Command string
	Name    string
	Modules string
	// BaseURL is the model API Name calls (unjailed: its provider's by
	// default); KeyPlaceholder, the key it sends, which a relay replaces.
	BaseURL, KeyPlaceholder string
	// AuthMethod is the ACP method to authenticate with, when advertised.
	AuthMethod string
}

// Args encodes d as `cohort intern` flags, in a fixed order (a jail's
// argv is part of its tag: the same settings make the same jail).
func (d Daemon) Args() []string {
	var a []string
	str := func(flag, v string) {
		if v != "" {
			a = append(a, "--"+flag, v)
		}
	}
	num := func(flag string, v int) {
		if v != 0 {
			a = append(a, "--"+flag, strconv.Itoa(v))
		}
	}
	dur := func(flag string, v time.Duration) {
		if v != 0 {
			a = append(a, "--"+flag, v.String())
		}
	}
	str("listen", d.Listen)
	num("listen-fd", d.ListenFD)
	num("secret-fd", d.SecretFD)
	str("data-dir", d.DataDir)
	a = append(a, "--intern-id", d.InternID, "--model", d.Model)
	str("gateway-url", d.GatewayURL)
	str("http-tool-proxy", d.HTTPToolProxy)
	str("log-level", d.LogLevel)
	dur("interaction-deadline", d.InteractionDeadline)
	num("retain-events", d.RetainEvents)
	num("retain-bytes", d.RetainBytes)
	num("max-paused-runs", d.MaxPausedRuns)
	num("max-paused-runs-per-caller", d.MaxPausedPerCaller)
	dur("session-idle-ttl", d.SessionIdleTTL)
	dur("init-timeout", d.InitTimeout)
	str("agent-command", d.Agent.Command)
	str("agent", d.Agent.Name)
	str("agent-modules", d.Agent.Modules)
	str("agent-key-placeholder", d.Agent.KeyPlaceholder)
	str("agent-base-url", d.Agent.BaseURL)
	str("agent-auth-method", d.Agent.AuthMethod)
	str("http-tool-ca-file", d.HTTPToolCAFile)
	return a
}

// Flags registers d's flags on fs, each defaulting to its environment
// variable or the daemon's default: parsing fs decodes Args into d.
func (d *Daemon) Flags(fs *flag.FlagSet) {
	fs.StringVar(&d.Listen, "listen", config.Env("COHORT_LISTEN", "127.0.0.1:0"), "address for HTTP/1.1 and h2c; loopback by default, port 0 picks one (COHORT_LISTEN)")
	fs.IntVar(&d.ListenFD, "listen-fd", 0, "serve on this inherited listening socket instead of --listen (set by the local provisioner)")
	fs.IntVar(&d.SecretFD, "secret-fd", 0, "read the secret from this inherited descriptor, then close it (set by the local provisioner)")
	fs.StringVar(&d.DataDir, "data-dir", config.Env("COHORT_DATA_DIR", "./.cohort-intern"), "the intern's sessions and the agent's working directory (COHORT_DATA_DIR)")
	fs.StringVar(&d.InternID, "intern-id", config.Env("COHORT_INTERN_ID", ""), "the intern's id, for Status and logs (COHORT_INTERN_ID)")
	fs.StringVar(&d.Model, "model", config.Env("COHORT_MODEL", ""), "the model configured on the intern, passed to the agent (COHORT_MODEL)")
	fs.StringVar(&d.GatewayURL, "gateway-url", config.Env("COHORT_GATEWAY_URL", ""), "the gateway's API base (http://host:port/api/v1): the http_request tool asks its vault for secrets with the daemon secret (COHORT_GATEWAY_URL)")
	fs.StringVar(&d.HTTPToolProxy, "http-tool-proxy", config.Env("COHORT_HTTP_TOOL_PROXY", ""), "HTTP proxy the http_request tool sends every request through (a jail's egress relay), http://host:port (COHORT_HTTP_TOOL_PROXY)")
	fs.StringVar(&d.HTTPToolCAFile, "http-tool-ca-file", config.Env("COHORT_HTTP_TOOL_CA_FILE", ""), "PEM certificates the http_request tool trusts besides the system roots (COHORT_HTTP_TOOL_CA_FILE)")
	fs.StringVar(&d.LogLevel, "log-level", config.Env("COHORT_LOG_LEVEL", "info"), "debug, info, warn or error (COHORT_LOG_LEVEL)")
	fs.DurationVar(&d.InteractionDeadline, "interaction-deadline", config.EnvDuration("COHORT_INTERACTION_DEADLINE", DefaultInteractionDeadline), "how long a question waits before its run is cancelled (COHORT_INTERACTION_DEADLINE)")
	fs.IntVar(&d.RetainEvents, "retain-events", config.EnvInt("COHORT_RETAIN_EVENTS", 10000), "events kept per run for replay (COHORT_RETAIN_EVENTS)")
	fs.IntVar(&d.RetainBytes, "retain-bytes", config.EnvInt("COHORT_RETAIN_BYTES", 4<<20), "bytes of events kept per run for replay (COHORT_RETAIN_BYTES)")
	fs.IntVar(&d.MaxPausedRuns, "max-paused-runs", config.EnvInt("COHORT_MAX_PAUSED_RUNS", 256), "runs held open across a question; past it new turns get 503 busy (COHORT_MAX_PAUSED_RUNS)")
	fs.IntVar(&d.MaxPausedPerCaller, "max-paused-runs-per-caller", config.EnvInt("COHORT_MAX_PAUSED_RUNS_PER_CALLER", 32), "of those, the most one caller (a user, or a key) may hold; past it that caller's new turns get 503 busy (COHORT_MAX_PAUSED_RUNS_PER_CALLER)")
	fs.DurationVar(&d.SessionIdleTTL, "session-idle-ttl", config.EnvDuration("COHORT_SESSION_IDLE_TTL", 11*time.Minute), "a session no run has used this long leaves the daemon's memory; its file brings it back (COHORT_SESSION_IDLE_TTL; keep it below the agent's)")
	fs.DurationVar(&d.InitTimeout, "init-timeout", config.EnvDuration("COHORT_INIT_TIMEOUT", 30*time.Second), "how long the agent may take to answer initialize (COHORT_INIT_TIMEOUT)")
	fs.StringVar(&d.Agent.Command, "agent-command", config.Env("COHORT_AGENT_COMMAND", ""), "the ACP agent to run, split on spaces; default: this executable with \"agent\" (COHORT_AGENT_COMMAND)")
	fs.StringVar(&d.Agent.Name, "agent", config.Env("COHORT_AGENT", ""), "a known third-party agent to run instead of --agent-command: "+strings.Join(agents.KnownNames(), ", ")+" (COHORT_AGENT; docs/agents.md)")
	fs.StringVar(&d.Agent.Modules, "agent-modules", config.Env("COHORT_AGENT_MODULES", ""), "with --agent, the node_modules directory it is installed in (npm install --no-save in agents/) (COHORT_AGENT_MODULES)")
	fs.StringVar(&d.Agent.BaseURL, "agent-base-url", config.Env("COHORT_AGENT_PROVIDER_URL", ""), "with --agent, the model API base URL it calls; default: its provider's (COHORT_AGENT_PROVIDER_URL)")
	fs.StringVar(&d.Agent.AuthMethod, "agent-auth-method", "", "the ACP authentication method to call authenticate with before any session, when the agent advertises it")
	fs.StringVar(&d.Agent.KeyPlaceholder, "agent-key-placeholder", "", "with --agent, the API key it sends (a jail's relay puts the real one in its place)")
}
