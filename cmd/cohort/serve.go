package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cohort-dev/cohort/internal/bootstrap"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/metrics"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

// serveFlags are serve's flags, declared on their flag set (defaults from
// cfg and the COHORT_* variables), and what checks them once parsed.
type serveFlags struct {
	fs                                                               *flag.FlagSet
	corsOrigins, regional, egressAllow, toolCA, internBinary, jailRO *string
	chat, background, fleet, limits                                  func() error
	backend                                                          func() (provision.Setup, string, error)
}

// newServeFlags declares serve's flags into cfg; usage goes to out.
func newServeFlags(cfg *config.Config, out io.Writer) *serveFlags {
	s := &serveFlags{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.Listen, "listen", env("COHORT_LISTEN", cfg.Listen), "address for HTTP/1.1 and h2c (COHORT_LISTEN)")
	dbFlags(fs, cfg)
	fs.BoolVar(&cfg.NoBootstrap, "no-bootstrap", envBool("COHORT_NO_BOOTSTRAP", false), "do not create the default organization and keys on an empty database (COHORT_NO_BOOTSTRAP)")
	fs.StringVar(&cfg.LogLevel, "log-level", env("COHORT_LOG_LEVEL", cfg.LogLevel), "debug, info, warn or error (COHORT_LOG_LEVEL)")
	s.backend = provision.Flags(fs, cfg.Provisioner)
	s.corsOrigins = fs.String("cors-allow-origins", env("COHORT_CORS_ALLOW_ORIGINS", ""), "comma-separated origins (https://app.example.com) whose browser pages may call the API from another origin; empty: none (COHORT_CORS_ALLOW_ORIGINS)")
	s.regional = fs.String("regional-hosts", env("COHORT_REGIONAL_HOSTS", ""), "comma-separated regional API hostnames on which the vault refuses requests (COHORT_REGIONAL_HOSTS)")
	fs.BoolVar(&cfg.UnsafeSharedHost, "unsafe-shared-host", envBool("COHORT_UNSAFE_SHARED_HOST", false), "run local interns unjailed, as this user on this host, where the machine cannot make jails: anyone with a workspace key can then read the gateway's keys (COHORT_UNSAFE_SHARED_HOST)")
	s.egressAllow = fs.String("intern-egress-allow-hosts", env("COHORT_INTERN_EGRESS_ALLOW_HOSTS", ""), "comma-separated hostnames, addresses and ranges on private networks (api.internal,10.0.0.0/8) that jailed interns may reach, with http_request say; loopback only by range, 169.254.169.254 never (COHORT_INTERN_EGRESS_ALLOW_HOSTS)")
	s.toolCA = fs.String("http-tool-ca-file", env("COHORT_HTTP_TOOL_CA_FILE", ""), "PEM certificates the interns' http_request tool trusts besides the system roots: a company CA (COHORT_HTTP_TOOL_CA_FILE)")
	s.internBinary = fs.String("intern-binary", env("COHORT_INTERN_BINARY", ""), "with local, the binary interns run from (their jail's init, daemon and built-in agent): a cohort-intern of this same build; default: cohort-intern beside this executable if it is there, else this executable; another build is refused, with a warning (COHORT_INTERN_BINARY)")
	s.jailRO = fs.String("jail-ro-bind", env("COHORT_JAIL_RO_BIND", ""), "comma-separated host paths bound read-only into every intern's jail, besides /usr, /bin, /lib and /etc (COHORT_JAIL_RO_BIND)")
	federationFlags(fs, cfg)
	webhookFlags(fs, cfg)
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", env("COHORT_METRICS_LISTEN", ""), "address of a separate listener serving Prometheus metrics at /metrics; empty: none (COHORT_METRICS_LISTEN)")
	s.chat = chatFlags(fs, cfg)
	s.background = backgroundFlags(fs, cfg)
	s.fleet = fleetFlags(fs, cfg)
	s.limits = limitFlags(fs, &cfg.InternLimits, "with local")
	agentFlags(fs, cfg)
	fs.Usage = groupedUsage(fs, "serve", serveGroups)
	s.fs = fs
	return s
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	flags := newServeFlags(&cfg, stderr)
	fs, corsOrigins, regional, egressAllow, toolCA, internBinary, jailRO := flags.fs, flags.corsOrigins, flags.regional, flags.egressAllow, flags.toolCA, flags.internBinary, flags.jailRO
	chat, background, fleet, limits, backend := flags.chat, flags.background, flags.fleet, flags.limits, flags.backend
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := chat(); err != nil {
		return err
	}
	if err := background(); err != nil {
		return err
	}
	if err := fleet(); err != nil {
		return err
	}
	if err := limits(); err != nil {
		return err
	}
	setup, name, err := backend()
	if err != nil {
		return err
	}
	cfg.Provisioner = name
	if _, err := cfg.Catalog(); err != nil {
		return err
	}
	cfg.RegionalHosts = splitList(*regional)
	cfg.CORSAllowOrigins = splitList(*corsOrigins)
	if _, err := server.ParseOrigins(cfg.CORSAllowOrigins); err != nil {
		return fmt.Errorf("--cors-allow-origins (COHORT_CORS_ALLOW_ORIGINS): %w", err)
	}
	cfg.JailReadOnly = splitList(*jailRO)
	cfg.InternEgressAllow = splitList(*egressAllow)
	if _, err := safehttp.ParseAllowlist(cfg.InternEgressAllow); err != nil {
		return fmt.Errorf("--intern-egress-allow-hosts (COHORT_INTERN_EGRESS_ALLOW_HOSTS): %w", err)
	}
	if cfg.HTTPToolCAFile = *toolCA; cfg.HTTPToolCAFile != "" {
		if cfg.HTTPToolCAFile, err = filepath.Abs(cfg.HTTPToolCAFile); err == nil {
			_, err = safehttp.ExtraRootsFromFile(cfg.HTTPToolCAFile)
		}
		if err != nil {
			return fmt.Errorf("--http-tool-ca-file (COHORT_HTTP_TOOL_CA_FILE): %w", err)
		}
	}
	// Every setting is checked before anything is opened or written
	// (issue 43): a wrong one leaves no database, KEK or bootstrap keys.
	if err := server.CheckSettings(cfg); err != nil {
		return err
	}
	deps := server.Deps{}
	if cfg.KEKFile != "" {
		if deps.KEK, err = envelope.Load(cfg.KEKFile); err != nil {
			return fmt.Errorf("--kek-file (COHORT_KEK_FILE): %w", err)
		}
	} else if _, err := os.Stat(cfg.KEKPath()); err == nil {
		if deps.KEK, err = envelope.Load(cfg.KEKPath()); err != nil {
			return err
		}
	}
	cfg.AgentBaseURL = env("COHORT_AGENT_BASE_URL", os.Getenv("OPENAI_BASE_URL"))
	cfg.AgentAPIKey = env("COHORT_AGENT_API_KEY", os.Getenv("OPENAI_API_KEY"))
	cfg.AgentEnv = config.AgentEnv(os.Environ())
	cfg.InternBinary = *internBinary
	if err := setup.Check(cfg); err != nil {
		return err
	}
	log, err := newLogger(stderr, cfg.LogLevel)
	if err != nil {
		return err
	}
	stopTracing, err := startTracing(ctx, "cohort-gateway")
	if err != nil {
		return err
	}
	defer stopTracing()

	// Listen, and make sure this machine can jail local interns, before
	// anything is written: a gateway that cannot start leaves no database,
	// KEK or bootstrap keys behind. (Local daemons are told where the
	// gateway listens, so the listener comes first.)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	env := provision.Env{Config: cfg, Log: log, Listen: ln.Addr(), GatewayURL: localGatewayURL(ln.Addr()), APIPrefix: server.Prefix}
	closeBackend, err := setup.Prepare(ctx, env)
	if err != nil {
		return err
	}
	defer closeBackend()

	db, err := openDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	if deps.KEK == nil {
		// The first start: created beside the database, before any key
		// that it will protect is shown.
		if deps.KEK, err = envelope.LoadOrCreate(cfg.KEKPath()); err != nil {
			return err
		}
	}

	if !cfg.NoBootstrap {
		res, err := bootstrap.Run(ctx, db)
		if err != nil {
			return fmt.Errorf("bootstrap: %w", err)
		}
		if res != nil {
			path, err := bootstrap.Write(cfg.DataDir, res)
			if err != nil {
				return fmt.Errorf("write bootstrap file: %w", err)
			}
			fmt.Fprintf(stdout, "Bootstrapped a new database. These keys are shown once; they are also in %s (mode 0600).\n", path)
			fmt.Fprintf(stdout, "  organization_id: %s\n  management_key:  %s\n  workspace_id:    %s\n  workspace_key:   %s\n  intern_id:       %s\n",
				res.OrganizationID, res.ManagementKey, res.WorkspaceID, res.WorkspaceKey, res.InternID)
		}
	}

	deps.DB, deps.Log = db, log
	if path, ok := store.SQLiteFile(cfg.DatabaseURL, cfg.DataDir); ok {
		// Exchanges read beside the one writer connection (WAL).
		if deps.Reads, err = store.OpenSQLiteReads(ctx, path, 4); err != nil {
			return err
		}
		defer deps.Reads.Close()
	}
	deps.GatewayURL, deps.Setup = env.GatewayURL, setup
	srv, err := server.New(ctx, cfg, deps)
	if err != nil {
		return err
	}
	defer srv.Close()
	if w := setup.Unsafe(); w != "" {
		fmt.Fprintln(stderr, "WARNING: "+w)
	}
	// The listeners' failures (the API's, the metrics').
	errc := make(chan error, 2)
	// New set the metrics hooks; their listener is up before anything runs.
	if cfg.MetricsListen != "" {
		stopMetrics, err := serveMetrics(cfg.MetricsListen, srv.Metrics, stdout, log, errc)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	h := telemetry.Handler(setup.Routes(srv.Handler()))
	// Before Start, which starts and adopts daemons.
	setup.Serve(h)
	if err := srv.Start(ctx); err != nil {
		return err
	}
	hs := server.HTTPServer(cfg.Listen, h, log)
	fmt.Fprintf(stdout, "Cohort is listening on http://%s (API under %s)\n", ln.Addr(), server.Prefix)
	log.Info("listening", "addr", ln.Addr().String())

	// A graceful stop hands the background runs over at once and ends
	// the run event streams, which would otherwise hold Shutdown.
	hs.RegisterOnShutdown(srv.Drain)
	go func() { errc <- hs.Serve(ln) }()
	// A loop that fails, or a listener, stops the gateway as a signal
	// would, with its error (ADR 0971).
	var failed error
	select {
	case failed = <-errc:
	case failed = <-srv.Failed():
	case <-ctx.Done():
	}
	if failed != nil {
		log.Error("stopping: the gateway cannot go on", "err", failed)
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		// A stop asked for is not a failure: what is still open at the
		// timeout (a long chat stream) is cut.
		log.Warn("connections still open at the shutdown timeout were closed", "timeout", cfg.ShutdownTimeout.String(), "err", err)
		hs.Close()
	}
	return failed
}

// localGatewayURL is how a daemon on this machine reaches the gateway's
// API: the listener's port on loopback when it listens on every address.
func localGatewayURL(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + server.Prefix
}

// fleetFlags declares the local fleet's flags; the returned func checks
// them after parsing, naming the flag (and its variable) that is wrong.
func fleetFlags(fs *flag.FlagSet, cfg *config.Config) func() error {
	idle := fs.String("intern-idle-timeout", env("COHORT_INTERN_IDLE_TIMEOUT", cfg.InternIdleTimeout.String()), "with local or kubernetes, an intern with no run, paused run or open stream for this long sleeps (its jail or Pod stops; the next turn wakes it); 0 never (COHORT_INTERN_IDLE_TIMEOUT)")
	maxAwake := fs.String("max-awake-interns", env("COHORT_MAX_AWAKE_INTERNS", "0"), "with local, at most this many interns awake; at the cap the least recently used idle one sleeps; 0 no cap (COHORT_MAX_AWAKE_INTERNS)")
	orphan := fs.String("jail-orphan-timeout", env("COHORT_JAIL_ORPHAN_TIMEOUT", cfg.JailOrphanTimeout.String()), "with local, how long interns' jails run on after the gateway stops (a restart adopts them, runs and paused runs intact); 0 stops them with it (COHORT_JAIL_ORPHAN_TIMEOUT)")
	conc := fs.String("intern-start-concurrency", env("COHORT_INTERN_START_CONCURRENCY", strconv.Itoa(cfg.InternStartConcurrency)), "with local, at most this many interns starting at once (COHORT_INTERN_START_CONCURRENCY)")
	return func() error {
		d, err := time.ParseDuration(*idle)
		if err != nil || d < 0 {
			return fmt.Errorf("--intern-idle-timeout (COHORT_INTERN_IDLE_TIMEOUT): %q is not a duration such as 10m or 30s (0 disables sleep)", *idle)
		}
		cfg.InternIdleTimeout = d
		if d, err = time.ParseDuration(*orphan); err != nil || d < 0 {
			return fmt.Errorf("--jail-orphan-timeout (COHORT_JAIL_ORPHAN_TIMEOUT): %q is not a duration such as 10m or 30s (0 stops jails with the gateway)", *orphan)
		}
		cfg.JailOrphanTimeout = d
		n, err := strconv.Atoi(*maxAwake)
		if err != nil || n < 0 {
			return fmt.Errorf("--max-awake-interns (COHORT_MAX_AWAKE_INTERNS): %q is not a whole number ≥ 0", *maxAwake)
		}
		cfg.MaxAwakeInterns = n
		n, err = strconv.Atoi(*conc)
		if err != nil || n < 1 {
			return fmt.Errorf("--intern-start-concurrency (COHORT_INTERN_START_CONCURRENCY): %q is not a whole number ≥ 1", *conc)
		}
		cfg.InternStartConcurrency = n
		return nil
	}
}

// serveMetrics serves what the gateway counts (server.New set the
// hooks), in the Prometheus format, on a listener of its own (never the
// API's). If serving fails, the error goes to errc (a stop is not sent).
func serveMetrics(addr string, m *metrics.Metrics, stdout io.Writer, log *slog.Logger, errc chan<- error) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}
	go func() {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("--metrics-listen: %w", err)
		}
	}()
	fmt.Fprintf(stdout, "Metrics on http://%s/metrics\n", ln.Addr())
	log.Info("metrics listening", "addr", ln.Addr().String())
	return func() { hs.Close() }, nil
}
