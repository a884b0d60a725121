package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/cohort-dev/cohort/internal/bootstrap"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/metrics"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	flags := newServeFlags(&cfg, stderr)
	if err := flags.parse(args); err != nil {
		return err
	}
	setup, name, err := flags.backend()
	if err != nil {
		return err
	}
	cfg.Fleet.Provisioner = name
	cfg.Agents.BaseURL, cfg.Agents.APIKey = agentEndpoint()
	cfg.Agents.Env = config.AgentEnv(os.Environ())
	// Every setting is checked before anything is opened or written
	// (issue 43), each once: a wrong one leaves no database, KEK or
	// bootstrap keys.
	if err := server.CheckSettings(cfg); err != nil {
		return err
	}
	if err := setup.Check(cfg); err != nil {
		return err
	}
	deps := server.Deps{}
	if cfg.Store.KEKFile != "" {
		if deps.KEK, err = envelope.Load(cfg.Store.KEKFile); err != nil {
			return fmt.Errorf("%s: %w", config.Setting("kek-file"), err)
		}
	} else if _, err := os.Stat(cfg.Store.KEKPath()); err == nil {
		if deps.KEK, err = envelope.Load(cfg.Store.KEKPath()); err != nil {
			return err
		}
	}
	log, err := newLogger(stderr, cfg.Server.LogLevel)
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
	ln, err := net.Listen("tcp", cfg.Server.Listen)
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

	db, err := openDB(ctx, cfg.Store)
	if err != nil {
		return err
	}
	defer db.Close()
	if deps.KEK == nil {
		// The first start: created beside the database, before any key
		// that it will protect is shown.
		if deps.KEK, err = envelope.LoadOrCreate(cfg.Store.KEKPath()); err != nil {
			return err
		}
	}

	if !cfg.Server.NoBootstrap {
		res, err := bootstrap.Run(ctx, db)
		if err != nil {
			return fmt.Errorf("bootstrap: %w", err)
		}
		if res != nil {
			path, err := bootstrap.Write(cfg.Store.DataDir, res)
			if err != nil {
				return fmt.Errorf("write bootstrap file: %w", err)
			}
			fmt.Fprintf(stdout, "Bootstrapped a new database. These keys are shown once; they are also in %s (mode 0600).\n", path)
			fmt.Fprintf(stdout, "  organization_id: %s\n  management_key:  %s\n  workspace_id:    %s\n  workspace_key:   %s\n  intern_id:       %s\n",
				res.OrganizationID, res.ManagementKey, res.WorkspaceID, res.WorkspaceKey, res.InternID)
		}
	}

	deps.DB, deps.Log = db, log
	if path, ok := store.SQLiteFile(cfg.Store.DatabaseURL, cfg.Store.DataDir); ok {
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
	if cfg.Server.MetricsListen != "" {
		stopMetrics, err := serveMetrics(cfg.Server.MetricsListen, srv.Metrics, stdout, log, errc)
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
	hs := server.HTTPServer(cfg.Server.Listen, h, log)
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
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		// A stop asked for is not a failure: what is still open at the
		// timeout (a long chat stream) is cut.
		log.Warn("connections still open at the shutdown timeout were closed", "timeout", cfg.Server.ShutdownTimeout.String(), "err", err)
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

// agentEndpoint is the operator's model endpoint and key for the built-in
// agent: COHORT_AGENT_BASE_URL and COHORT_AGENT_API_KEY, else OPENAI_*.
// Variables only: a key on the command line would show in ps.
func agentEndpoint() (baseURL, apiKey string) {
	return config.Env("COHORT_AGENT_BASE_URL", os.Getenv("OPENAI_BASE_URL")), config.Env("COHORT_AGENT_API_KEY", os.Getenv("OPENAI_API_KEY"))
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
