package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/federation"
	"github.com/cohort-dev/cohort/internal/interncmd"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/runs"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/turn"
	"github.com/cohort-dev/cohort/internal/webhooks"
)

// The flags of serve, one function per subsystem of config.Config. Each
// flag's variable is named from the flag (config.EnvName); each default is
// the package's that owns the setting (turn.DefaultTurnTimeout …), or
// config.Default's. The operator's policies that `cohort admin` applies too
// (the agents, the intern limits, the federation's and the webhooks'
// egress) are declared by the same functions there (ADR 0962).

// serveFlags are serve's flags, declared on their flag set, and what
// checks them once parsed.
type serveFlags struct {
	fs      *flag.FlagSet
	checks  []func() error
	backend func() (provision.Setup, string, error)
}

// newServeFlags declares serve's flags into cfg; usage goes to out.
func newServeFlags(cfg *config.Config, out io.Writer) *serveFlags {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(out)
	s := &serveFlags{fs: fs}
	s.checks = append(s.checks, serverFlags(fs, &cfg.Server))
	dbFlags(fs, &cfg.Store)
	config.StringVar(fs, &cfg.Store.RedisURL, "redis-url", cfg.Store.RedisURL, "redis://… to share rate limits between replicas; empty keeps them in memory")
	s.backend = provision.Flags(fs, cfg.Fleet.Provisioner)
	s.checks = append(s.checks, fleetFlags(fs, &cfg.Fleet), limitFlags(fs, &cfg.Fleet.Limits, "with local"))
	agentFlags(fs, &cfg.Agents)
	config.StringVar(fs, &cfg.Agents.Command, "agent-command", cfg.Agents.Command, "with the local provisioner, the ACP agent each daemon runs, split on spaces; default: this executable with \"agent\"")
	s.checks = append(s.checks, chatFlags(fs, &cfg.Chat), backgroundFlags(fs, &cfg.Background))
	federationFlags(fs, &cfg.Federation)
	webhookFlags(fs, &cfg.Webhooks)
	fs.Usage = groupedUsage(fs, "serve", serveGroups)
	return s
}

// parse parses args and checks what the flags hold, naming the flag that
// is wrong.
func (s *serveFlags) parse(args []string) error {
	if err := s.fs.Parse(args); err != nil {
		return err
	}
	for _, check := range s.checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// dbFlags are the flags of every command that opens the database.
func dbFlags(fs *flag.FlagSet, st *config.Store) {
	config.StringVar(fs, &st.DataDir, "data-dir", st.DataDir, "data directory: embedded database, key files, bootstrap.json")
	config.StringVar(fs, &st.KEKFile, "kek-file", st.KEKFile, "key-encryption key (Tink keyset JSON); default <data-dir>/kek.json, created on first start")
	config.StringVar(fs, &st.DatabaseURL, "database-url", st.DatabaseURL, "postgres://… for PostgreSQL; empty for the embedded SQLite file in the data directory")
}

func serverFlags(fs *flag.FlagSet, c *config.Server) func() error {
	config.StringVar(fs, &c.Listen, "listen", c.Listen, "address for HTTP/1.1 and h2c")
	config.StringVar(fs, &c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	config.BoolVar(fs, &c.NoBootstrap, "no-bootstrap", c.NoBootstrap, "do not create the default organization and keys on an empty database")
	config.StringVar(fs, &c.MetricsListen, "metrics-listen", c.MetricsListen, "address of a separate listener serving Prometheus metrics at /metrics; empty: none")
	config.ListVar(fs, &c.CORSAllowOrigins, "cors-allow-origins", "comma-separated origins (https://app.example.com) whose browser pages may call the API from another origin; empty: none")
	config.ListVar(fs, &c.RegionalHosts, "regional-hosts", "comma-separated regional API hostnames on which the vault refuses requests")
	return durationFlag(fs, &c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "how long graceful shutdown waits for requests to finish", time.Nanosecond, "a positive duration such as 30s or 5m")
}

// fleetFlags are how interns are hosted, whatever the backend (its own
// flags are its Kind's, internal/provision).
func fleetFlags(fs *flag.FlagSet, c *config.Fleet) func() error {
	return all(
		durationFlag(fs, &c.IdleTimeout, "intern-idle-timeout", c.IdleTimeout, "with local or kubernetes, an intern with no run, paused run or open stream for this long sleeps (its jail or Pod stops; the next turn wakes it); 0 never", 0, "a duration such as 10m or 30s (0 disables sleep)"),
		intFlag(fs, &c.MaxAwake, "max-awake-interns", 0, "with local, at most this many interns awake; at the cap the least recently used idle one sleeps; 0 no cap", 0, "a whole number ≥ 0"),
		intFlag(fs, &c.StartConcurrency, "intern-start-concurrency", provision.DefaultStartConcurrency, "with local, at most this many interns starting at once", 1, "a whole number ≥ 1"),
	)
}

// limitFlags are the bounds of each intern's jail, the ceiling of an
// intern's own (serve, `cohort admin intern create|update`, and `cohort
// intern --jail`).
var limitFlags = interncmd.LimitFlags

// agentFlags are the catalog of agents interns may name: serve's, and the
// admin CLI's, which validates an intern's agent as serve does.
func agentFlags(fs *flag.FlagSet, c *config.Agents) {
	config.StringVar(fs, &c.Modules, "agent-modules", c.Modules, "node_modules directory of the third-party agents interns may run (npm install --no-save in agents/; docs/agents.md): "+strings.Join(agents.KnownNames(), ", "))
	config.RepeatedVar(fs, &c.Custom, "agent", "a custom ACP agent interns may run, name=command")
	config.RepeatedVar(fs, &c.Endpoints, "agent-endpoint", "name=URL: the model API a known agent's requests go to instead of its provider's")
	config.RepeatedVar(fs, &c.AuthMethods, "agent-auth-method", "name=method: the ACP authentication method an agent is authenticated with before any session, when it advertises it")
}

func chatFlags(fs *flag.FlagSet, c *config.Chat) func() error {
	config.StringVar(fs, &c.TurnRate, "turn-rate", turn.DefaultTurnRate.Spec(), "chat turns per user or organization: N/s, N/m or N/h[,burst=B]; shared through --redis-url when set")
	const positive = "a positive duration such as 30s or 5m"
	return all(
		durationFlag(fs, &c.Keepalive, "chat-keepalive", sse.DefaultKeepalive, "silence after which a chat stream or a background run's event stream sends a keepalive (': keepalive'; on Connect a keepalive message) (the spec's 30s)", time.Nanosecond, positive),
		durationFlag(fs, &c.FirstEventTimeout, "first-event-timeout", turn.DefaultFirstEventTimeout, "request budget: how long a chat request waits for the agent's first event before 504 timeout", time.Nanosecond, positive),
		durationFlag(fs, &c.EventTimeout, "event-timeout", turn.DefaultEventTimeout, "longest silence of an intern on an open chat stream before the stream ends with a timeout", time.Nanosecond, positive),
		durationFlag(fs, &c.TurnTimeout, "turn-timeout", turn.DefaultTurnTimeout, "longest a chat request's run may take in all (time paused for an answer excluded) before it ends with a timeout and is cancelled", time.Nanosecond, positive),
		durationFlag(fs, &c.InteractionDeadline, "interaction-deadline", internd.DefaultInteractionDeadline, "with the local provisioner, how long a question waits for its answer before the run is cancelled", time.Nanosecond, positive),
	)
}

func backgroundFlags(fs *flag.FlagSet, c *config.Background) func() error {
	var bytes int
	check := all(
		intFlag(fs, &c.MaxRunning, "background-max-running", runs.DefaultMaxRunning, "running background runs one workspace may have; past it a background request is 429", 1, "a positive number"),
		intFlag(fs, &bytes, "background-event-bytes", runs.DefaultMaxEventBytes, "bytes of chunks kept per background run; past it only the chunks that end a response are kept", 1, "a positive number"),
		durationFlag(fs, &c.Retention, "background-retention", runs.DefaultRetention, "how long an ended background run and its chunks are kept", time.Nanosecond, "a positive duration such as 168h"),
		durationFlag(fs, &c.Lease, "background-lease", runs.DefaultLease, "how long a gateway's claim to record a background run lasts unrenewed: the longest a run waits to be taken over after its gateway was killed", time.Second, "a duration of 1s or more"),
	)
	return func() error {
		err := check()
		c.EventBytes = int64(bytes)
		return err
	}
}

// federationFlags are workload identity's settings; server.New applies
// them.
func federationFlags(fs *flag.FlagSet, c *config.Federation) {
	config.StringVar(fs, &c.TokenIssuer, "token-issuer", federation.DefaultTokenIssuer, "iss and aud of federation access tokens; set it to the public base URL")
	config.StringVar(fs, &c.ExchangeRate, "exchange-rate", federation.DefaultExchangeRate.Spec(), "token exchanges per source address: N/s, N/m or N/h[,burst=B]")
	federationEgressFlags(fs, c)
}

// federationEgressFlags are where the federation's fetches may go: serve's
// and the admin CLI's (issuer-create's checks, dry-run's fetches).
func federationEgressFlags(fs *flag.FlagSet, c *config.Federation) {
	config.StringVar(fs, &c.ExtraCAFile, "extra-ca-file", c.ExtraCAFile, "PEM certificates trusted in addition to the system roots when fetching identity provider keys")
	config.ListVar(fs, &c.AllowHosts, "federation-allow-hosts", "comma-separated hostnames, addresses and ranges (keycloak.internal,10.0.0.0/8) of identity providers on private addresses that discovery and JWKS fetches may reach over https; loopback and link-local only by range, 169.254.169.254 never")
}

// webhookFlags are the webhooks' settings; server.New applies them.
func webhookFlags(fs *flag.FlagSet, c *config.Webhooks) {
	webhookEgressFlags(fs, c)
	config.DurationVar(fs, &c.Lease, "webhook-lease", webhooks.DefaultLease, "how long a webhook delivery a replica claimed is its own before another replica (or this one restarted) sends it again; longer than the 15s attempt timeout")
}

// webhookEgressFlags are where deliveries may go: serve's and the admin
// CLI's (the save-time check).
func webhookEgressFlags(fs *flag.FlagSet, c *config.Webhooks) {
	config.ListVar(fs, &c.AllowHosts, "webhook-allow-hosts", "comma-separated hostnames, addresses and ranges (hooks.internal,10.0.0.0/8) of webhook receivers on private addresses that deliveries may reach (plain http only to these); loopback and link-local only by range, 169.254.169.254 never")
}

// durationFlag declares a duration flag into p; the returned func checks,
// once parsed, that it is at least least, naming the flag otherwise.
func durationFlag(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string, least time.Duration, want string) func() error {
	raw := config.String(fs, name, def.String(), usage)
	return func() error {
		d, err := time.ParseDuration(*raw)
		if err != nil || d < least {
			return fmt.Errorf("%s: %q is not %s", config.Setting(name), *raw, want)
		}
		*p = d
		return nil
	}
}

// intFlag is durationFlag for a whole number.
func intFlag(fs *flag.FlagSet, p *int, name string, def int, usage string, least int, want string) func() error {
	raw := config.String(fs, name, strconv.Itoa(def), usage)
	return func() error {
		n, err := strconv.Atoi(*raw)
		if err != nil || n < least {
			return fmt.Errorf("%s: %q is not %s", config.Setting(name), *raw, want)
		}
		*p = n
		return nil
	}
}

// all runs checks in order, to the first error.
func all(checks ...func() error) func() error {
	return func() error {
		for _, c := range checks {
			if err := c(); err != nil {
				return err
			}
		}
		return nil
	}
}
