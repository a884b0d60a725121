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
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/metrics"
	"github.com/cohort-dev/cohort/internal/provision/kubepods"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/provision/remote"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/telemetry"
	"github.com/cohort-dev/cohort/internal/vault"
)

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Listen, "listen", env("COHORT_LISTEN", cfg.Listen), "address for HTTP/1.1 and h2c (COHORT_LISTEN)")
	dbFlags(fs, &cfg)
	fs.BoolVar(&cfg.NoBootstrap, "no-bootstrap", envBool("COHORT_NO_BOOTSTRAP", false), "do not create the default organization and keys on an empty database (COHORT_NO_BOOTSTRAP)")
	fs.StringVar(&cfg.LogLevel, "log-level", env("COHORT_LOG_LEVEL", cfg.LogLevel), "debug, info, warn or error (COHORT_LOG_LEVEL)")
	fs.StringVar(&cfg.Provisioner, "provisioner", env("COHORT_PROVISIONER", cfg.Provisioner), "local: the gateway runs each intern's daemon in a jail; remote: the operator runs them and registers each; kubernetes: each awake intern is a Pod (COHORT_PROVISIONER)")
	kube := kubeFlags(fs)
	corsOrigins := fs.String("cors-allow-origins", env("COHORT_CORS_ALLOW_ORIGINS", ""), "comma-separated origins (https://app.example.com) whose browser pages may call the API from another origin; empty: none (COHORT_CORS_ALLOW_ORIGINS)")
	regional := fs.String("regional-hosts", env("COHORT_REGIONAL_HOSTS", ""), "comma-separated regional API hostnames on which the vault refuses requests (COHORT_REGIONAL_HOSTS)")
	fs.BoolVar(&cfg.UnsafeSharedHost, "unsafe-shared-host", envBool("COHORT_UNSAFE_SHARED_HOST", false), "run local interns unjailed, as this user on this host, where the machine cannot make jails: anyone with a workspace key can then read the gateway's keys (COHORT_UNSAFE_SHARED_HOST)")
	egressAllow := fs.String("intern-egress-allow-hosts", env("COHORT_INTERN_EGRESS_ALLOW_HOSTS", ""), "comma-separated hostnames, addresses and ranges on private networks (api.internal,10.0.0.0/8) that jailed interns may reach, with http_request say; loopback only by range, 169.254.169.254 never (COHORT_INTERN_EGRESS_ALLOW_HOSTS)")
	toolCA := fs.String("http-tool-ca-file", env("COHORT_HTTP_TOOL_CA_FILE", ""), "PEM certificates the interns' http_request tool trusts besides the system roots: a company CA (COHORT_HTTP_TOOL_CA_FILE)")
	internBinary := fs.String("intern-binary", env("COHORT_INTERN_BINARY", ""), "with local, the binary interns run from (their jail's init, daemon and built-in agent): a cohort-intern of this same build; default: cohort-intern beside this executable if it is there, else this executable; another build is refused, with a warning (COHORT_INTERN_BINARY)")
	jailRO := fs.String("jail-ro-bind", env("COHORT_JAIL_RO_BIND", ""), "comma-separated host paths bound read-only into every intern's jail, besides /usr, /bin, /lib and /etc (COHORT_JAIL_RO_BIND)")
	federationFlags(fs, &cfg)
	webhookFlags(fs, &cfg)
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", env("COHORT_METRICS_LISTEN", ""), "address of a separate listener serving Prometheus metrics at /metrics; empty: none (COHORT_METRICS_LISTEN)")
	chat := chatFlags(fs, &cfg)
	background := backgroundFlags(fs, &cfg)
	fleet := fleetFlags(fs, &cfg)
	limits := limitFlags(fs, &cfg.InternLimits, "with local")
	agentFlags(fs, &cfg)
	fs.Usage = groupedUsage(fs, "serve", serveGroups)
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
	var err error
	var kubeCfg *kubepods.Config
	switch cfg.Provisioner {
	case localjail.Name, remote.Name:
	case kubepods.Name:
		if kubeCfg, err = kube.build(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("--provisioner must be local, remote or kubernetes, not %q", cfg.Provisioner)
	}
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
	cfg.AgentBaseURL = env("COHORT_AGENT_BASE_URL", os.Getenv("OPENAI_BASE_URL"))
	cfg.AgentAPIKey = env("COHORT_AGENT_API_KEY", os.Getenv("OPENAI_API_KEY"))
	cfg.AgentEnv = jailAgentEnv(os.Environ())
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
	if cfg.Provisioner == localjail.Name {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		cfg.InternBinary = localjail.InternBinary(ctx, *internBinary, self, log)
	}
	var jc *localjail.JailConfig
	var jailRelay *egress.Relay
	if cfg.Provisioner == localjail.Name && !cfg.UnsafeSharedHost {
		// The data directory exists before the jail's hidden paths are
		// resolved (through symlinks too); it is created empty.
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return err
		}
		var stopRelays func()
		if jc, jailRelay, stopRelays, err = internJail(cfg, ln.Addr(), log); err != nil {
			return err
		}
		defer stopRelays()
		checkDescriptors(log, cfg.MaxAwakeInterns, jailRelay.MaxConnsPerIntern())
		if err := server.ProbeJail(cfg, jc); err != nil {
			return err
		}
	}

	db, err := openDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()

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

	deps := server.Deps{DB: db, Log: log}
	if deps.KEK, err = loadKEK(cfg); err != nil {
		return err
	}
	if path, ok := store.SQLiteFile(cfg.DatabaseURL, cfg.DataDir); ok {
		// Exchanges read beside the one writer connection (WAL).
		if deps.Reads, err = store.OpenSQLiteReads(ctx, path, 4); err != nil {
			return err
		}
		defer deps.Reads.Close()
	}
	var proxyCA *vault.ProxyCA
	if jc != nil {
		// The jails trust this CA's certificate; its key stays here
		// (ADR 0931).
		if proxyCA, err = vault.LoadProxyCA(ctx, db, deps.KEK, nil); err != nil {
			return err
		}
		jc.ProxyCA = proxyCA.CertPEM()
	}
	deps.GatewayURL = localGatewayURL(ln.Addr())
	var podModels *egress.Relay
	switch {
	case cfg.Provisioner == kubepods.Name:
		if podModels, err = podRelay(kubeCfg, cfg, log); err != nil {
			return err
		}
		defer podModels.Close()
		deps.Kube = kubeCfg
	case cfg.Provisioner == localjail.Name && cfg.UnsafeSharedHost:
		fmt.Fprintln(stderr, "WARNING: "+server.UnsafeSharedHostWarning)
	case cfg.Provisioner == localjail.Name:
		deps.Jail, deps.JailProbed = jc, true
	}
	srv, err := server.New(ctx, cfg, deps)
	if err != nil {
		return err
	}
	defer srv.Close()
	// New set the metrics hooks; their listener is up before anything runs.
	if cfg.MetricsListen != "" {
		stopMetrics, err := serveMetrics(cfg.MetricsListen, srv.Metrics, stdout, log)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	h := srv.Handler()
	if kb, ok := srv.Backend.(*kubepods.Backend); ok && podModels != nil {
		h = withPodRelay(h, kb.PodModelRelay(srv.Provisioner, podModels))
	}
	h = telemetry.Handler(h)
	if jailRelay != nil {
		// Before Start, which starts and adopts jails: each jail's
		// gateway relay serves this handler in process, the intern named
		// in each request (the exchange limiter keys on it).
		jailRelay.SetGateway(h)
		jailRelay.SetSecrets(vault.ProxyDoor{S: srv.Vault, CA: proxyCA})
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	hs := server.HTTPServer(cfg.Listen, h, log)
	fmt.Fprintf(stdout, "Cohort is listening on http://%s (API under %s)\n", ln.Addr(), server.Prefix)
	log.Info("listening", "addr", ln.Addr().String())

	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
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
// API's).
func serveMetrics(addr string, m *metrics.Metrics, stdout io.Writer, log *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}
	go hs.Serve(ln)
	fmt.Fprintf(stdout, "Metrics on http://%s/metrics\n", ln.Addr())
	log.Info("metrics listening", "addr", ln.Addr().String())
	return func() { hs.Close() }, nil
}
