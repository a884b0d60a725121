// Package config is the typed configuration of `cohort serve`, with its
// defaults. cmd/cohort fills it from flags and COHORT_* variables;
// server.New builds the whole gateway from it. Errors about a field name
// its flag.
package config

import (
	"fmt"
	"path/filepath"
	"runtime"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
)

// Config configures the gateway.
type Config struct {
	// Listen is the address for HTTP/1.1 and h2c.
	Listen string
	// DataDir holds the embedded database, key files and bootstrap.json.
	DataDir string
	// DatabaseURL selects PostgreSQL (postgres://…); empty means the
	// embedded SQLite file in DataDir.
	DatabaseURL string
	// KEKFile is the key-encryption key (a Tink keyset file). Empty means
	// <DataDir>/kek.json, created on first start.
	KEKFile string
	// NoBootstrap skips creating the default organization on an empty database.
	NoBootstrap bool
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// RegionalHosts are Host header values (regional API hostnames) on
	// which the vault refuses every request with 403.
	RegionalHosts []string
	// ShutdownTimeout bounds graceful shutdown.
	ShutdownTimeout time.Duration
	// Provisioner hosts interns: "local" (daemons started by the gateway,
	// each in a jail), "remote" (daemons registered by the operator) or
	// "kubernetes" (a Pod per awake intern). Empty hosts none: chat has no
	// daemons to call (tests that bring their own).
	Provisioner string
	// MetricsListen, when set, is the address of the separate listener
	// serving Prometheus metrics; the server then counts what it does.
	MetricsListen string

	// CORSAllowOrigins are the browser origins (scheme://host[:port]) whose
	// pages may call the API (under /api/) from another origin: preflights
	// are answered and answers readable for them alone. Empty: none.
	CORSAllowOrigins []string

	// RedisURL (redis:// or rediss://), when set, keeps rate limits in
	// Redis so that replicas share them; empty keeps them in memory.
	RedisURL string
	// ExtraCAFile holds PEM certificates trusted, in addition to the
	// system roots, when fetching identity provider documents.
	ExtraCAFile string
	// TokenIssuer is the iss and aud of federation access tokens; set it
	// to the public base URL.
	TokenIssuer string
	// ExchangeRate is the per-address token exchange limit: "N/s", "N/m"
	// or "N/h", optionally ",burst=B".
	ExchangeRate string
	// TurnRate is the chat turn limit per user or organization, in the
	// same form as ExchangeRate; shared through Redis when RedisURL is set.
	TurnRate string
	// AgentCommand, when set, is the ACP agent the local provisioner's
	// daemons run instead of `cohort agent`.
	AgentCommand string
	// AgentBaseURL and AgentAPIKey are the operator's model endpoint and
	// key for the built-in agent (COHORT_AGENT_BASE_URL and
	// COHORT_AGENT_API_KEY, else OPENAI_*): the relay of a jail or Pod
	// calls it with the real key, the agent holding only a placeholder.
	AgentBaseURL, AgentAPIKey string
	// AgentEnv is what of the gateway's environment reaches a jailed or
	// Pod daemon and its agent: the built-in agent's COHORT_AGENT_*
	// settings, without the endpoint and key.
	AgentEnv []string
	// AgentModules is the node_modules directory the known third-party
	// agents are installed in; Agents are custom "name=command" agents and
	// AgentEndpoints "name=URL" model endpoints of known ones. Together the
	// catalog of agents an intern may name (internal/agents).
	AgentModules   string
	Agents         []string
	AgentEndpoints []string
	// AgentAuthMethods are "name=method" ACP authentication methods.
	AgentAuthMethods []string
	// UnsafeSharedHost runs local interns unjailed, as the gateway's own
	// user on its own host: only for machines that cannot make jails and
	// interns whose users are trusted with the gateway's keys.
	UnsafeSharedHost bool
	// InternEgressAllow are the non-public destinations (hostnames,
	// addresses, ranges) interns may reach through their jail's internet
	// relay: a company API on a private network. Empty: public only.
	InternEgressAllow []string
	// HTTPToolCAFile holds PEM certificates every local intern's
	// http_request tool trusts besides the system roots.
	HTTPToolCAFile string
	// JailReadOnly are extra host paths bound read-only into every jail
	// (an agent's runtime installed outside /usr, say).
	JailReadOnly []string
	// InternIdleTimeout puts an idle local intern to sleep (0: never).
	InternIdleTimeout time.Duration
	// JailOrphanTimeout is how long a local intern's jail runs on after
	// its gateway has gone: a gateway started within it adopts the jail
	// with its runs. 0 stops jails with their gateway.
	JailOrphanTimeout time.Duration
	// InternBinary is what local interns run from (the jail's init, the
	// daemon and the built-in agent): cohort-intern, or this gateway's own
	// executable when empty. serve resolves and checks it
	// (localjail.InternBinary).
	InternBinary string
	// InternLimits bound each local intern's jail (and `cohort intern
	// --jail`'s): memory, processes, CPU share, /tmp and /dev/shm, and its
	// directory (InternDisk). A zero field is unbounded.
	InternLimits InternLimits
	// MaxAwakeInterns caps the awake local interns (0: no cap).
	MaxAwakeInterns int
	// InternStartConcurrency bounds local daemons starting at once.
	InternStartConcurrency int
	// ChatKeepalive is the silence after which a chat stream sends a
	// keepalive comment; FirstEventTimeout the request budget until the
	// agent's first event; EventTimeout the longest silence of an open
	// stream's daemon; TurnTimeout the longest one chat request's run may
	// take in all before it is cancelled.
	ChatKeepalive, FirstEventTimeout, EventTimeout, TurnTimeout time.Duration
	// InteractionDeadline is how long a question waits, passed to every
	// local intern's daemon.
	InteractionDeadline time.Duration
	// Background runs (internal/runs, docs/background.md): the running
	// ones a workspace may have, the bytes of chunks kept per run, how
	// long ended runs are kept, and a recording gateway's lease.
	BackgroundMaxRunning int
	BackgroundEventBytes int64
	BackgroundRetention  time.Duration
	BackgroundLease      time.Duration
	// FederationAllowHosts are the non-public identity provider hosts and
	// ranges discovery and JWKS fetches may reach.
	FederationAllowHosts []string
	// WebhookAllowHosts are the non-public hosts and ranges webhook
	// deliveries may reach; WebhookLease how long a claimed delivery is
	// one replica's (0: the default).
	WebhookAllowHosts []string
	WebhookLease      time.Duration
}

// Default returns the defaults the README documents.
func Default() Config {
	return Config{
		Listen:          "127.0.0.1:8080",
		DataDir:         "./.cohort",
		LogLevel:        "info",
		ShutdownTimeout: 10 * time.Second,
		Provisioner:     "local",
		TokenIssuer:     "cohort",
		ExchangeRate:    "60/m",
		TurnRate:        "60/m",

		InternIdleTimeout:      10 * time.Minute,
		JailOrphanTimeout:      10 * time.Minute,
		InternStartConcurrency: 4,
		InternLimits:           DefaultInternLimits(),

		ChatKeepalive:       30 * time.Second,
		FirstEventTimeout:   30 * time.Second,
		EventTimeout:        10 * time.Minute,
		TurnTimeout:         30 * time.Minute,
		InteractionDeadline: 5 * time.Minute,

		BackgroundMaxRunning: 16,
		BackgroundEventBytes: 8 << 20,
		BackgroundRetention:  7 * 24 * time.Hour,
		BackgroundLease:      30 * time.Second,
	}
}

// Catalog is the catalog of agents interns may name (AgentModules, Agents,
// AgentEndpoints); errors name the setting.
func (c Config) Catalog() (agents.Catalog, error) {
	custom, err := agents.ParseCustom(c.Agents)
	if err != nil {
		return agents.Catalog{}, fmt.Errorf("--agent (COHORT_AGENTS): %w", err)
	}
	endpoints, err := agents.ParseEndpoints(c.AgentEndpoints)
	if err != nil {
		return agents.Catalog{}, fmt.Errorf("--agent-endpoint (COHORT_AGENT_ENDPOINTS): %w", err)
	}
	auth, err := agents.ParseAuthMethods(c.AgentAuthMethods)
	if err != nil {
		return agents.Catalog{}, fmt.Errorf("--agent-auth-method (COHORT_AGENT_AUTH_METHODS): %w", err)
	}
	cat := agents.Catalog{Custom: custom, Endpoints: endpoints, AuthMethods: auth}
	if c.AgentModules != "" {
		if cat.Modules, err = filepath.Abs(c.AgentModules); err != nil {
			return agents.Catalog{}, err
		}
	}
	return cat, nil
}

// InternLimits are the operator's bounds on one intern's jail.
type InternLimits struct {
	// Memory in bytes, page cache and tmpfs included.
	Memory int64
	// Processes (and threads) at once.
	Processes int
	// CPUWeight is the relative CPU share, 1–10000; 100 is equal.
	CPUWeight int
	// CPUs caps each jail's CPU time at this many CPUs (0: no cap); by
	// default all of the host's but one (1 on a 1- or 2-CPU host), so that
	// no intern takes the whole machine.
	CPUs float64
	// Tmpfs is the size of /tmp, and of /dev/shm, in bytes.
	Tmpfs int64
	// Disk bounds the intern's directory in bytes (see docs/security.md
	// for what the host's file system lets it enforce).
	Disk int64
}

// DefaultInternLimits protect a shared host out of the box.
func DefaultInternLimits() InternLimits {
	return InternLimits{Memory: 4 << 30, Processes: 1024, CPUWeight: 100, CPUs: float64(max(runtime.NumCPU()-1, 1)),
		Tmpfs: 1 << 30, Disk: 10 << 30}
}
