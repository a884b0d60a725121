// Package config is the typed configuration of `cohort serve`, nested by
// subsystem. cmd/cohort fills it from flags and COHORT_* variables (one
// variable per flag, named by EnvName); Validate checks it before anything
// is opened or written; server.New builds the whole gateway from it.
// Errors about a field name its flag (Setting).
//
// A subsystem's defaults are its package's (turn.DefaultTurnTimeout,
// runs.DefaultLease …): a zero field here takes them, and the flags show
// them. Default sets only what no package owns (ADR 0961).
package config

import (
	"fmt"
	"path/filepath"
	"runtime"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/safehttp"
)

// Config configures the gateway.
type Config struct {
	Server     Server
	Store      Store
	Fleet      Fleet
	Agents     Agents
	Chat       Chat
	Background Background
	Federation Federation
	Webhooks   Webhooks
}

// Server is the gateway's own listener and process.
type Server struct {
	// Listen is the address for HTTP/1.1 and h2c.
	Listen string
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// ShutdownTimeout bounds graceful shutdown.
	ShutdownTimeout time.Duration
	// MetricsListen, when set, is the address of the separate listener
	// serving Prometheus metrics; the server then counts what it does.
	MetricsListen string
	// CORSAllowOrigins are the browser origins (scheme://host[:port]) whose
	// pages may call the API (under /api/) from another origin: preflights
	// are answered and answers readable for them alone. Empty: none.
	CORSAllowOrigins []string
	// RegionalHosts are Host header values (regional API hostnames) on
	// which the vault refuses every request with 403.
	RegionalHosts []string
	// NoBootstrap skips creating the default organization on an empty database.
	NoBootstrap bool
}

// Store is where the gateway keeps its state.
type Store struct {
	// DataDir holds the embedded database, key files and bootstrap.json.
	DataDir string
	// DatabaseURL selects PostgreSQL (postgres://…); empty means the
	// embedded SQLite file in DataDir.
	DatabaseURL string
	// KEKFile is the key-encryption key (a Tink keyset file). Empty means
	// <DataDir>/kek.json, created on first start.
	KEKFile string
	// RedisURL (redis:// or rediss://), when set, keeps rate limits in
	// Redis so that replicas share them; empty keeps them in memory.
	RedisURL string
}

// Fleet is how interns are hosted, whatever the backend.
type Fleet struct {
	// Provisioner names the backend that hosts interns (--provisioner; the
	// kinds registered in internal/provision, whose flag default is the
	// kind registered as the default). Empty hosts none: chat has no
	// daemons to call (tests that bring their own).
	Provisioner string
	// IdleTimeout puts an idle intern to sleep (0: never).
	IdleTimeout time.Duration
	// MaxAwake caps the awake interns (0: no cap).
	MaxAwake int
	// StartConcurrency bounds daemons starting at once (0: the
	// provisioner's default).
	StartConcurrency int
	// Limits bound each intern (its jail's, and `cohort intern --jail`'s):
	// the ceiling of an intern's own limits. A zero field is unbounded.
	Limits InternLimits
}

// Agents are what interns run and the model endpoint of the built-in agent.
type Agents struct {
	// Command, when set, is the ACP agent the local provisioner's daemons
	// run instead of `cohort agent`.
	Command string
	// BaseURL and APIKey are the operator's model endpoint and key for the
	// built-in agent (COHORT_AGENT_BASE_URL and COHORT_AGENT_API_KEY, else
	// OPENAI_*): the relay of a jail or Pod calls it with the real key, the
	// agent holding only a placeholder.
	BaseURL, APIKey string
	// Env is what of the gateway's environment reaches a jailed or Pod
	// daemon and its agent: the built-in agent's COHORT_AGENT_* settings,
	// without the endpoint and key.
	Env []string
	// Modules is the node_modules directory the known third-party agents
	// are installed in; Custom are "name=command" agents and Endpoints
	// "name=URL" model endpoints of known ones; AuthMethods "name=method"
	// ACP authentication methods. Together the catalog of agents an intern
	// may name (internal/agents).
	Modules     string
	Custom      []string
	Endpoints   []string
	AuthMethods []string
}

// Chat bounds chat turns. Zero durations take internal/chat's (and
// internal/sse's) defaults.
type Chat struct {
	// TurnRate is the chat turn limit per user or organization, "N/s",
	// "N/m" or "N/h", optionally ",burst=B"; shared through Redis when
	// Store.RedisURL is set. Empty: turn.DefaultTurnRate.
	TurnRate string
	// Keepalive is the silence after which a chat stream sends a keepalive
	// comment; FirstEventTimeout the request budget until the agent's first
	// event; EventTimeout the longest silence of an open stream's daemon;
	// TurnTimeout the longest one chat request's run may take in all.
	Keepalive, FirstEventTimeout, EventTimeout, TurnTimeout time.Duration
	// InteractionDeadline is how long a question waits, passed to every
	// intern's daemon (0: the daemon's default).
	InteractionDeadline time.Duration
}

// Background are the settings of background runs (internal/runs,
// docs/background.md); zero takes runs' defaults.
type Background struct {
	MaxRunning int
	EventBytes int64
	Retention  time.Duration
	Lease      time.Duration
}

// Federation is workload identity federation's operator settings.
type Federation struct {
	// TokenIssuer is the iss and aud of federation access tokens; set it
	// to the public base URL. Empty: federation.DefaultTokenIssuer.
	TokenIssuer string
	// ExchangeRate is the per-address token exchange limit, in the form of
	// Chat.TurnRate. Empty: federation.DefaultExchangeRate.
	ExchangeRate string
	// ExtraCAFile holds PEM certificates trusted, in addition to the
	// system roots, when fetching identity provider documents.
	ExtraCAFile string
	// AllowHosts are the non-public identity provider hosts and ranges
	// discovery and JWKS fetches may reach.
	AllowHosts []string
}

// Webhooks are the operator's webhook settings.
type Webhooks struct {
	// AllowHosts are the non-public hosts and ranges deliveries may reach.
	AllowHosts []string
	// Lease is how long a claimed delivery is one replica's (0: the
	// default).
	Lease time.Duration
}

// Default returns the defaults no subsystem's package owns.
func Default() Config {
	return Config{
		Server: Server{Listen: "127.0.0.1:8080", LogLevel: "info", ShutdownTimeout: 10 * time.Second},
		Store:  Store{DataDir: "./.cohort"},
		Fleet:  Fleet{IdleTimeout: 10 * time.Minute, Limits: DefaultInternLimits()},
	}
}

// Validate checks what can be checked of c without opening anything, each
// setting once: serve calls it (through server.CheckSettings) before it
// writes anything. Errors name the flag and its variable.
func (c Config) Validate() error {
	if _, err := ParseOrigins(c.Server.CORSAllowOrigins); err != nil {
		return fmt.Errorf("%s: %w", Setting("cors-allow-origins"), err)
	}
	if _, err := safehttp.ParseAllowlist(c.Federation.AllowHosts); err != nil {
		return fmt.Errorf("%s: %w", Setting("federation-allow-hosts"), err)
	}
	if _, err := safehttp.ParseAllowlist(c.Webhooks.AllowHosts); err != nil {
		return fmt.Errorf("%s: %w", Setting("webhook-allow-hosts"), err)
	}
	if _, err := safehttp.ExtraRootsFromFile(c.Federation.ExtraCAFile); err != nil {
		return err
	}
	_, err := c.Agents.Catalog()
	return err
}

// Catalog is the catalog of agents interns may name (Modules, Custom,
// Endpoints, AuthMethods); errors name the setting.
func (a Agents) Catalog() (agents.Catalog, error) {
	custom, err := agents.ParseCustom(a.Custom)
	if err != nil {
		return agents.Catalog{}, fmt.Errorf("--agent (%s): %w", ListEnvName("agent"), err)
	}
	endpoints, err := agents.ParseEndpoints(a.Endpoints)
	if err != nil {
		return agents.Catalog{}, fmt.Errorf("--agent-endpoint (%s): %w", ListEnvName("agent-endpoint"), err)
	}
	auth, err := agents.ParseAuthMethods(a.AuthMethods)
	if err != nil {
		return agents.Catalog{}, fmt.Errorf("--agent-auth-method (%s): %w", ListEnvName("agent-auth-method"), err)
	}
	cat := agents.Catalog{Custom: custom, Endpoints: endpoints, AuthMethods: auth}
	if a.Modules != "" {
		if cat.Modules, err = filepath.Abs(a.Modules); err != nil {
			return agents.Catalog{}, err
		}
	}
	return cat, nil
}

// InternLimits bound one intern's jail: the operator's (--intern-*, the
// ceiling every backend enforces) and an intern's own (stored as its row's
// limit_* columns; 0 there is the operator's setting, each own bound at
// most the operator's). Comparable: a change restarts the intern's jail.
// One type for both, without importing the store (cohort-intern links
// this package); the jail's mechanism (jail.Limits) and the wire
// (cohortv1.InternLimits) are converted to at their edges.
type InternLimits struct {
	// Memory in bytes, page cache and tmpfs included.
	Memory int64 `bun:"memory,notnull"`
	// Processes (and threads) at once.
	Processes int `bun:"processes,notnull"`
	// CPUWeight is the relative CPU share, 1–10000; 100 is equal.
	CPUWeight int `bun:"cpu_weight,notnull"`
	// CPUs caps each jail's CPU time at this many CPUs (0: no cap); by
	// default all of the host's but one (1 on a 1- or 2-CPU host), so that
	// no intern takes the whole machine.
	CPUs float64 `bun:"cpus,notnull"`
	// Tmpfs is the size of /tmp, and of /dev/shm, in bytes.
	Tmpfs int64 `bun:"tmpfs,notnull"`
	// Disk bounds the intern's directory in bytes (see docs/security.md
	// for what the host's file system lets it enforce).
	Disk int64 `bun:"disk,notnull"`
}

// DefaultInternLimits protect a shared host out of the box.
func DefaultInternLimits() InternLimits {
	return InternLimits{Memory: 4 << 30, Processes: 1024, CPUWeight: 100, CPUs: float64(max(runtime.NumCPU()-1, 1)),
		Tmpfs: 1 << 30, Disk: 10 << 30}
}
