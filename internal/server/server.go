// Package server assembles the gateway: New builds every service from the
// typed configuration, wired to its Connect and REST doors under /api/v1
// (routes.go declares each with what it admits), plus health checks.
package server

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/uptrace/bun"
	"golang.org/x/sync/errgroup"

	"github.com/cohort-dev/cohort/internal/accesslog"
	"github.com/cohort-dev/cohort/internal/accounts"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/chat"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/federation"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/metrics"
	"github.com/cohort-dev/cohort/internal/provision"
	// Every backend, registered (provision.Register).
	_ "github.com/cohort-dev/cohort/internal/provision/backends"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/runs"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/streamdeadline"
	"github.com/cohort-dev/cohort/internal/turn"
	"github.com/cohort-dev/cohort/internal/vault"
	"github.com/cohort-dev/cohort/internal/webhooks"
	"github.com/cohort-dev/cohort/internal/workspaces"
)

// Prefix is the version prefix every API path carries.
const Prefix = "/api/v1"

// Server holds the gateway's services, wired by New.
type Server struct {
	DB         *bun.DB
	Log        *slog.Logger
	KEK        *envelope.KEK
	Auth       *auth.Authenticator
	Accounts   *accounts.Service
	Workspaces *workspaces.Service
	Interns    *interns.Service
	// Provisioner hosts interns' daemons and dials them: it is Interns'
	// Lifecycle and Chat's Daemons. Nil when the configuration names no
	// provisioner.
	Provisioner *provision.Provisioner
	// Backend is what hosts Provisioner's daemons (localjail, kubepods,
	// remote), as the configuration names it.
	Backend provision.Backend
	Vault   *vault.Service
	// Chat is the chat orchestration.
	Chat *chat.Service
	// ChatSSE tunes the chat event streams of the REST door.
	ChatSSE sse.Options
	// Runs runs background turns (the chat doors hand it a request with
	// "background": true); set its Notifier before Start to hear of their
	// status changes.
	Runs       *runs.Manager
	Federation *federation.Service
	// Webhooks manages webhook endpoints; WebhookWorker drains the
	// outbox (RunChanged enqueues into it).
	Webhooks      *webhooks.Service
	WebhookWorker *webhooks.Worker
	// Warning, when set, is reported by /readyz (interns run unjailed).
	Warning string
	// Metrics counts every request and what the services do; nil unless
	// the configuration has a metrics listener (serve serves its Handler).
	Metrics *metrics.Metrics

	// origins are the other origins whose pages may call the API (CORS).
	origins []string

	stopRun context.CancelFunc
	// failed receives, once, what ended the loops Start runs: the first
	// failure, or nil when they were stopped.
	failed  chan error
	closers []func() error
}

// Deps are what cmd/cohort opens before the gateway is built, the outside
// world: the database, the key-encryption key, the listener's address, and
// for the local and Kubernetes provisioners the jail's relays or the
// cluster. DB, KEK and Log are required.
type Deps struct {
	DB *bun.DB
	// Reads, when set, serves token exchanges beside DB's one writer
	// connection (SQLite in WAL mode).
	Reads *sql.DB
	KEK   *envelope.KEK
	Log   *slog.Logger
	// GatewayURL is where local daemons reach the API (the listener, on
	// loopback), passed to each: their http_request tool's vault.
	GatewayURL string
	// Setup is the backend's setup (provision.Flags), checked and
	// prepared by the caller before it wrote anything; nil: the
	// configuration's provisioner with its defaults, unprepared (a local
	// provisioner then needs UnsafeSharedHost, a cluster its setup).
	Setup provision.Setup
}

// New builds the whole gateway from cfg over d: every service, its limits
// (in memory, or on Redis when cfg.Store.RedisURL is set), the federation's
// outbound client, the provisioner cfg names (its jail probed), the metrics
// hooks, and the routes, each checked to declare what it admits. Nothing
// runs until Start; Close releases what New opened. Errors about a setting
// name its flag.
func New(ctx context.Context, cfg config.Config, d Deps) (_ *Server, err error) {
	if d.DB == nil || d.KEK == nil || d.Log == nil {
		return nil, errors.New("server: DB, KEK and Log are required")
	}
	if err := CheckSettings(cfg); err != nil {
		return nil, err
	}
	// Checked: what follows parses what it uses and cannot fail.
	turnRate, exchangeRate, _ := rates(cfg)
	roots, _ := safehttp.ExtraRootsFromFile(cfg.Federation.ExtraCAFile)
	idpAllow, _ := safehttp.ParseAllowlist(cfg.Federation.AllowHosts)
	hookAllow, _ := safehttp.ParseAllowlist(cfg.Webhooks.AllowHosts)
	catalog, _ := cfg.Agents.Catalog()
	origins, _ := config.ParseOrigins(cfg.Server.CORSAllowOrigins)
	setup := d.Setup
	if setup == nil && cfg.Fleet.Provisioner != "" {
		if setup, err = provision.DefaultSetup(cfg.Fleet.Provisioner); err != nil {
			return nil, err
		}
	}

	db, log := d.DB, d.Log
	// An intern's own limits may only be lower than the operator's.
	ins := &interns.Service{DB: db, Ceiling: cfg.Fleet.Limits}
	if cfg.Agents.Modules != "" || len(catalog.Custom) > 0 {
		// Without either, the catalog holds the built-in agent alone: nil
		// says so.
		ins.Agents = catalog
	}
	fed := federation.New(db, d.KEK, log)
	s := &Server{
		DB:         db,
		Log:        log,
		KEK:        d.KEK,
		Auth:       &auth.Authenticator{DB: db, Tokens: fed},
		Accounts:   &accounts.Service{DB: db},
		Workspaces: &workspaces.Service{DB: db},
		Interns:    ins,
		Vault:      &vault.Service{DB: db, KEK: d.KEK, Interns: ins, RegionalHosts: cfg.Server.RegionalHosts},
		// The chat doors and the background runs open turns alike.
		Chat: &chat.Service{Interns: ins, Service: &turn.Service{Log: log,
			FirstEventTimeout: cfg.Chat.FirstEventTimeout, EventTimeout: cfg.Chat.EventTimeout, TurnTimeout: cfg.Chat.TurnTimeout}},
		ChatSSE:    sse.Options{Keepalive: cfg.Chat.Keepalive},
		Federation: fed,
		Webhooks:   &webhooks.Service{DB: db, KEK: d.KEK, Allow: hookAllow, Log: log},
		WebhookWorker: &webhooks.Worker{DB: db, KEK: d.KEK, Log: log, Lease: cfg.Webhooks.Lease,
			Client: webhooks.NewClient(webhooks.ClientOptions{Allow: hookAllow, ExtraRoots: roots})},
		origins: origins,
	}
	s.Webhooks.Wake = s.WebhookWorker.Wake
	s.Runs = runs.New(db, s.Chat.Service, ins, log, runs.Config{MaxRunning: cfg.Background.MaxRunning, MaxEventBytes: cfg.Background.EventBytes,
		Retention: cfg.Background.Retention, Lease: cfg.Background.Lease, Keepalive: cfg.Chat.Keepalive})
	// A run's status changes become webhook events in the same transaction.
	s.Runs.Notifier = s.Webhooks
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if _, err := checkRoutes(s.routes()); err != nil {
		return nil, err
	}

	fed.Reads = d.Reads
	fed.Config.TokenIssuer = cfg.Federation.TokenIssuer
	fed.Config.HTTPClient = safehttp.New(safehttp.Options{ExtraRoots: roots, Allow: idpAllow})
	// Chat turns and token exchanges are counted in memory, or in Redis so
	// that every replica counts the same.
	if cfg.Store.RedisURL == "" {
		if s.Chat.Limiter, err = ratelimit.NewMemory(turnRate, nil); err != nil {
			return nil, fmt.Errorf("--turn-rate: %w", err)
		}
		if fed.Config.Limiter, err = ratelimit.NewMemory(exchangeRate, nil); err != nil {
			return nil, fmt.Errorf("--exchange-rate: %w", err)
		}
	} else {
		rdb, err := ratelimit.OpenRedis(ctx, cfg.Store.RedisURL)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, rdb.Close)
		if s.Chat.Limiter, err = ratelimit.NewRedis(rdb, "cohort:turn:", turnRate); err != nil {
			return nil, fmt.Errorf("--turn-rate: %w", err)
		}
		if fed.Config.Limiter, err = ratelimit.NewRedis(rdb, "cohort:exchange:", exchangeRate); err != nil {
			return nil, fmt.Errorf("--exchange-rate: %w", err)
		}
	}

	if cfg.Fleet.Provisioner != "" {
		// A third-party agent's model key is a vault secret of its intern,
		// released per request to the model relay (audited).
		ag := provision.Agents{Catalog: catalog, Command: cfg.Agents.Command,
			ModelKey: func(ctx context.Context, internID, name, host string) (string, error) {
				return s.Vault.Release(ctx, vault.ReleaseRequest{InternID: internID, Name: name, Host: host, Actor: "model-relay"})
			}}
		prov := &provision.Provisioner{DB: db, KEK: d.KEK, Log: log,
			IdleTimeout: cfg.Fleet.IdleTimeout, MaxAwake: cfg.Fleet.MaxAwake, StartConcurrency: cfg.Fleet.StartConcurrency}
		if cfg.Server.MetricsListen != "" {
			s.Metrics = metrics.New(db)
			setup.Observe(provision.Hooks{KubeCall: s.Metrics.KubeCall})
		}
		env := provision.Env{Config: cfg, Log: log, GatewayURL: d.GatewayURL, APIPrefix: Prefix,
			SecretsDoor: func() (string, egress.Secrets, error) {
				ca, err := vault.LoadProxyCA(ctx, db, d.KEK, nil)
				if err != nil {
					return "", nil, err
				}
				return ca.CertPEM(), vault.ProxyDoor{S: s.Vault, CA: ca}, nil
			}}
		if prov.Backend, err = setup.Backend(env, prov, ag); err != nil {
			return nil, err
		}
		prov.WakeTimeout = setup.WakeTimeout()
		if w := setup.Unsafe(); w != "" {
			log.Warn(w)
			s.Warning = w
		}
		for _, w := range setup.Warnings() {
			log.Warn("an intern limit is not enforced on this host", "limit", w)
		}
		s.Provisioner, s.Backend, ins.Lifecycle, s.Chat.Daemons = prov, prov.Backend, prov, prov
		s.closers = append(s.closers, func() error { prov.Close(); return nil })
	}

	if cfg.Server.MetricsListen != "" {
		// Every hook is set here, before anything (Start) can call it.
		if s.Metrics == nil {
			s.Metrics = metrics.New(db)
		}
		m := s.Metrics
		s.Chat.Observer, fed.OnExchange, s.Vault.Observe = m, m.Exchange, m.Vault
		s.Runs.Observer, s.WebhookWorker.Observe = m, m.WebhookAttempt
		if s.Provisioner != nil {
			s.Provisioner.OnWake = m.Wake
		}
	}
	return s, nil
}

// CheckSettings checks the settings New reads without opening anything
// (cfg.Validate, the rates and the provisioner's name): serve calls it
// before it writes anything, so that a wrong setting leaves no database,
// KEK or bootstrap keys behind. Errors name the flag.
func CheckSettings(cfg config.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if _, _, err := rates(cfg); err != nil {
		return err
	}
	if cfg.Fleet.Provisioner != "" {
		if _, err := provision.Lookup(cfg.Fleet.Provisioner); err != nil {
			return err
		}
	}
	return nil
}

// rates are the chat turn and token exchange limits; empty is the
// owning package's default.
func rates(cfg config.Config) (turns, exchange ratelimit.Rate, err error) {
	turns, exchange = turn.DefaultTurnRate, federation.DefaultExchangeRate
	if cfg.Chat.TurnRate != "" {
		if turns, err = ratelimit.ParseRate(cfg.Chat.TurnRate); err != nil {
			return turns, exchange, fmt.Errorf("--turn-rate: %w", err)
		}
	}
	if cfg.Federation.ExchangeRate != "" {
		if exchange, err = ratelimit.ParseRate(cfg.Federation.ExchangeRate); err != nil {
			return turns, exchange, fmt.Errorf("--exchange-rate: %w", err)
		}
	}
	return turns, exchange, nil
}

// Start starts the gateway's own work: the provisioner (the daemons of
// local interns, the fleet's reconciler), then the gateway's loops, each a
// Run(ctx) error under one group (ADR 0971): federation's periodic work
// (signing key rotation, audit retention), the background runs' takeover
// and the webhooks' outbox. A loop's failure ends the others and is
// reported by Failed; Close ends them.
func (s *Server) Start(ctx context.Context) error {
	if s.Provisioner != nil {
		if err := s.Provisioner.Start(ctx); err != nil {
			return fmt.Errorf("start interns: %w", err)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	s.stopRun = cancel
	g, gctx := errgroup.WithContext(rctx)
	loops := []struct {
		name string
		run  func(context.Context) error
	}{
		{"federation", s.Federation.Run},
		// After the provisioner: runs taken over attach to daemons it adopted.
		{"background runs", s.Runs.Run},
		{"webhooks", s.WebhookWorker.Run},
	}
	for _, l := range loops {
		g.Go(func() error {
			if err := l.run(gctx); err != nil {
				return fmt.Errorf("%s: %w", l.name, err)
			}
			return nil
		})
	}
	s.failed = make(chan error, 1)
	go func() { s.failed <- g.Wait() }()
	return nil
}

// Failed receives, once, what ended the loops Start runs: the first
// loop's failure (the others are then stopped: the gateway must stop too),
// or nil once they were stopped (Close, or Start's ctx ended). Before
// Start it never receives.
func (s *Server) Failed() <-chan error { return s.failed }

// Drain begins a graceful stop: the background runs this gateway records
// are handed over (released at once; another replica takes them over
// within its runs.Config.Scan) and the run event streams read here end,
// their readers resuming elsewhere from their last event id. Call it as
// the HTTP server's shutdown begins, so that no reader holds it until its
// timeout (ADR 0921). Close does it too.
func (s *Server) Drain() {
	if s.Runs != nil {
		s.Runs.Close()
	}
}

// Close stops what Start started and releases what New opened: the
// provisioner's daemons (a Pod outlives it), the Redis connection. It may
// be called more than once.
func (s *Server) Close() {
	if s.stopRun != nil {
		s.stopRun()
		// Let the webhook deliveries in flight finish and be recorded (a
		// slow receiver's are left to their lease).
		select {
		case <-s.WebhookWorker.Done():
		case <-time.After(5 * time.Second):
		}
	}
	if s.Runs != nil {
		// Before the provisioner: the recorders read its daemons.
		s.Runs.Close()
	}
	s.Federation.Close()
	for _, c := range slices.Backward(s.closers) {
		c()
	}
	s.closers = nil
}

// Handler returns the gateway's HTTP handler: the declared routes, each
// behind what it admits, with the access log, streaming deadlines and CORS
// for the API.
func (s *Server) Handler() http.Handler {
	mux, err := s.mux()
	if err != nil {
		// New checked these very routes.
		panic(err)
	}
	var observe func(string, string, int, time.Duration)
	if s.Metrics != nil {
		observe = s.Metrics.Request
	}
	return accesslog.Handler(s.Log, streamdeadline.Handler(cors(s.origins, mux), sse.DefaultWriteTimeout), observe)
}

// HTTPServer wraps h in an http.Server that speaks HTTP/1.1 and h2c, with
// header limits and timeouts. Streaming handlers clear the write deadline
// for themselves; nothing else may take longer.
func HTTPServer(addr string, h http.Handler, log *slog.Logger) *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		Protocols:         &protocols,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
