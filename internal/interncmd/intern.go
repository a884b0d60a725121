package interncmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/httptool"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

// Jailed is what `cohort intern --jail` runs: the daemon's settings, to
// start it in a jail of its own.
type Jailed struct {
	Listen, DataDir, InternID, Model, Secret, GatewayURL string
	// ReadOnly are host paths bound read-only into the jail; Hide, host
	// paths the jail must not see.
	ReadOnly, Hide []string
	// Args are the daemon's flags inside the jail.
	Args   []string
	Limits config.InternLimits
}

// JailFunc starts the daemon in a jail (cmd/cohort's, which links the local
// provisioner's jails and relays); nil in binaries that cannot.
type JailFunc func(ctx context.Context, o Jailed, stdout, stderr io.Writer, log *slog.Logger) error

// Intern runs one intern's daemon: `cohort intern`. With --jail it hands
// the parsed settings to jailed.
func Intern(ctx context.Context, args []string, stdout, stderr io.Writer, jailed JailFunc) error {
	oneProc()
	fs := flag.NewFlagSet("intern", flag.ContinueOnError)
	fs.SetOutput(stderr)
	self, err := os.Executable()
	if err != nil {
		self = "cohort"
	}
	var (
		listen       = fs.String("listen", config.Env("COHORT_LISTEN", "127.0.0.1:0"), "address for HTTP/1.1 and h2c; loopback by default, port 0 picks one (COHORT_LISTEN)")
		dataDir      = fs.String("data-dir", config.Env("COHORT_DATA_DIR", "./.cohort-intern"), "the intern's sessions and the agent's working directory (COHORT_DATA_DIR)")
		internID     = fs.String("intern-id", config.Env("COHORT_INTERN_ID", ""), "the intern's id, for Status and logs (COHORT_INTERN_ID)")
		secretFile   = fs.String("secret-file", config.Env("COHORT_INTERN_SECRET_FILE", ""), "with --jail, the file holding the daemon secret (unjailed, the agent could read it: set COHORT_INTERN_SECRET instead) (COHORT_INTERN_SECRET_FILE)")
		agentCommand = fs.String("agent-command", config.Env("COHORT_AGENT_COMMAND", ""), "the ACP agent to run, split on spaces; default: this executable with \"agent\" (COHORT_AGENT_COMMAND)")
		model        = fs.String("model", config.Env("COHORT_MODEL", ""), "the model configured on the intern, passed to the agent (COHORT_MODEL)")
		agentName    = fs.String("agent", config.Env("COHORT_AGENT", ""), "a known third-party agent to run instead of --agent-command: "+strings.Join(KnownAgents(), ", ")+" (COHORT_AGENT; docs/agents.md)")
		agentModules = fs.String("agent-modules", config.Env("COHORT_AGENT_MODULES", ""), "with --agent, the node_modules directory it is installed in (npm install --no-save in agents/) (COHORT_AGENT_MODULES)")
		agentBaseURL = fs.String("agent-base-url", config.Env("COHORT_AGENT_PROVIDER_URL", ""), "with --agent, the model API base URL it calls; default: its provider's (COHORT_AGENT_PROVIDER_URL)")
		agentAuth    = fs.String("agent-auth-method", "", "the ACP authentication method to call authenticate with before any session, when the agent advertises it")
		agentKey     = fs.String("agent-key-placeholder", "", "with --agent, the API key it sends (a jail's relay puts the real one in its place)")
		deadline     = fs.Duration("interaction-deadline", EnvDuration("COHORT_INTERACTION_DEADLINE", 5*time.Minute), "how long a question waits before its run is cancelled (COHORT_INTERACTION_DEADLINE)")
		retain       = fs.Int("retain-events", EnvInt("COHORT_RETAIN_EVENTS", 10000), "events kept per run for replay (COHORT_RETAIN_EVENTS)")
		retainBytes  = fs.Int("retain-bytes", EnvInt("COHORT_RETAIN_BYTES", 4<<20), "bytes of events kept per run for replay (COHORT_RETAIN_BYTES)")
		maxPaused    = fs.Int("max-paused-runs", EnvInt("COHORT_MAX_PAUSED_RUNS", 256), "runs held open across a question; past it new turns get 503 busy (COHORT_MAX_PAUSED_RUNS)")
		sessionTTL   = fs.Duration("session-idle-ttl", EnvDuration("COHORT_SESSION_IDLE_TTL", 11*time.Minute), "a session no run has used this long leaves the daemon's memory; its file brings it back (COHORT_SESSION_IDLE_TTL; keep it below the agent's)")
		maxPerCaller = fs.Int("max-paused-runs-per-caller", EnvInt("COHORT_MAX_PAUSED_RUNS_PER_CALLER", 32), "of those, the most one caller (a user, or a key) may hold; past it that caller's new turns get 503 busy (COHORT_MAX_PAUSED_RUNS_PER_CALLER)")
		initTimeout  = fs.Duration("init-timeout", EnvDuration("COHORT_INIT_TIMEOUT", 30*time.Second), "how long the agent may take to answer initialize (COHORT_INIT_TIMEOUT)")
		logLevel     = fs.String("log-level", config.Env("COHORT_LOG_LEVEL", "info"), "debug, info, warn or error (COHORT_LOG_LEVEL)")
		gatewayURL   = fs.String("gateway-url", config.Env("COHORT_GATEWAY_URL", ""), "the gateway's API base (http://host:port/api/v1): the http_request tool asks its vault for secrets with the daemon secret (COHORT_GATEWAY_URL)")
		toolCAFile   = fs.String("http-tool-ca-file", config.Env("COHORT_HTTP_TOOL_CA_FILE", ""), "PEM certificates the http_request tool trusts besides the system roots (COHORT_HTTP_TOOL_CA_FILE)")
		toolProxy    = fs.String("http-tool-proxy", config.Env("COHORT_HTTP_TOOL_PROXY", ""), "HTTP proxy the http_request tool sends every request through (a jail's egress relay), http://host:port (COHORT_HTTP_TOOL_PROXY)")
		listenFD     = fs.Int("listen-fd", -1, "serve on this inherited listening socket instead of --listen (set by the local provisioner)")
		secretFD     = fs.Int("secret-fd", -1, "read the secret from this inherited descriptor, then close it (set by the local provisioner)")
		jailFlag     = fs.Bool("jail", config.EnvBool("COHORT_INTERN_JAIL", false), "run the daemon and its agent in a jail of their own, as the local provisioner does: for several daemons on one host (COHORT_INTERN_JAIL)")
		jailRO       = fs.String("jail-ro-bind", config.Env("COHORT_JAIL_RO_BIND", ""), "with --jail, comma-separated host paths bound read-only into the jail besides /usr, /bin, /lib and /etc (COHORT_JAIL_RO_BIND)")
	)
	limits := config.DefaultInternLimits()
	checkLimits := LimitFlags(fs, &limits, "with --jail")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := checkLimits(); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	log, err := NewLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	// Nothing else of this user (the agent, its commands) may read the
	// daemon's memory or /proc entries: the secret lives there. Nor, as
	// root, the environment it came in.
	ScrubEnviron("COHORT_INTERN_SECRET")
	NonDumpable()
	// Nothing this process inherited reaches the agent or its commands:
	// the listener and the secret pipe are closed after use below, and
	// whatever else came (a supervisor's descriptor) is close-on-exec.
	if err := jail.SealInherited(); err != nil {
		return fmt.Errorf("seal inherited descriptors: %w", err)
	}
	if !*jailFlag && *secretFD < 0 && *secretFile != "" {
		// Unjailed, the agent and its commands run as this user: a file
		// the daemon can read, they can read, and with it derive the
		// daemon's credential (ReleaseSecret: vault values).
		return errors.New("--secret-file needs --jail: without a jail the agent runs as this user and could read the file, " +
			"and with it ask the vault for this intern's secrets; run with --jail, or give the secret in COHORT_INTERN_SECRET " +
			"from a source this user cannot read (a root-owned systemd EnvironmentFile, a secret manager; docs/security.md)")
	}
	var secret string
	if *secretFD >= 0 {
		secret, err = readSecretFD(*secretFD)
	} else {
		secret, err = ReadSecret(*secretFile)
	}
	if err != nil {
		return err
	}
	roots, err := safehttp.ExtraRootsFromFile(*toolCAFile)
	if err != nil {
		return err
	}
	var proxy *url.URL
	if *toolProxy != "" {
		if proxy, err = url.Parse(*toolProxy); err != nil || proxy.Scheme != "http" || proxy.Host == "" {
			return fmt.Errorf("--http-tool-proxy must be http://host:port, not %q", *toolProxy)
		}
	}
	if *jailFlag {
		if jailed == nil {
			return errors.New("--jail needs the cohort binary (this one runs only inside a jail)")
		}
		pass := []string{"--log-level", *logLevel, "--interaction-deadline", deadline.String(),
			"--retain-events", strconv.Itoa(*retain), "--retain-bytes", strconv.Itoa(*retainBytes),
			"--max-paused-runs", strconv.Itoa(*maxPaused), "--max-paused-runs-per-caller", strconv.Itoa(*maxPerCaller),
			"--session-idle-ttl", sessionTTL.String(),
			"--init-timeout", initTimeout.String()}
		if *agentCommand != "" {
			pass = append(pass, "--agent-command", *agentCommand)
		}
		ro := config.SplitList(*jailRO)
		if *agentName != "" {
			modules, err := filepath.Abs(*agentModules)
			if err != nil {
				return err
			}
			ro = append(ro, modules)
			pass = append(pass, "--agent", *agentName, "--agent-modules", modules, "--agent-key-placeholder", agents.KeyPlaceholder)
		}
		if *toolCAFile != "" {
			ca, err := filepath.Abs(*toolCAFile)
			if err != nil {
				return err
			}
			ro = append(ro, ca)
			pass = append(pass, "--http-tool-ca-file", ca)
		}
		return jailed(ctx, Jailed{Listen: *listen, DataDir: *dataDir, InternID: *internID, Model: *model,
			Secret: secret, GatewayURL: *gatewayURL, ReadOnly: ro, Hide: []string{*secretFile}, Args: pass, Limits: limits}, stdout, stderr, log)
	}
	argv := strings.Fields(*agentCommand)
	if len(argv) == 0 {
		argv = []string{self, "agent"}
	}
	builtIn := *agentName == "" && isBuiltInAgent(argv, self)
	var agentEnv []string
	if *agentName != "" {
		if argv, agentEnv, err = installAgent(*agentName, *agentModules, *agentBaseURL, *agentKey, *model, *dataDir); err != nil {
			return err
		}
	}
	d, err := internd.New(internd.Config{InternID: *internID, Secret: secret, DataDir: *dataDir, AgentCommand: argv, AgentEnv: agentEnv, AgentNests: builtIn,
		AgentKeys: []string{*agentKey, agents.KeyPlaceholder}, AgentAuthMethod: *agentAuth,
		Model: *model, InteractionDeadline: *deadline, RetainEvents: *retain, RetainBytes: *retainBytes,
		MaxPausedRuns: *maxPaused, MaxPausedPerCaller: *maxPerCaller, SessionIdleTTL: *sessionTTL, InitTimeout: *initTimeout, Log: log.With("intern", *internID),
		GatewayURL: *gatewayURL, HTTPTool: httptool.Options{ExtraRoots: roots, Proxy: proxy}})
	if err != nil {
		return err
	}
	defer d.Close()
	var ln net.Listener
	if *listenFD >= 0 {
		f := os.NewFile(uintptr(*listenFD), "listener")
		ln, err = net.FileListener(f)
		f.Close() // the listener holds its own descriptor, closed on exec
	} else {
		ln, err = net.Listen("tcp", *listen)
	}
	if err != nil {
		return err
	}
	stopTracing, err := StartTracing(ctx, "cohort-intern")
	if err != nil {
		return err
	}
	defer stopTracing()
	hs := internd.HTTPServer(telemetry.Handler(d.Handler()), log)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	// The first line on stdout is the address: a provisioner that passed
	// port 0 reads it to learn where the daemon listens.
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())
	log.Info("intern daemon listening", "addr", ln.Addr().String(), "intern", *internID)
	go func() {
		if err := d.Start(ctx); err != nil {
			log.Error("agent did not start; the daemon keeps serving and retries on the next turn", "err", err)
		}
		// What starting left behind (package initializers, the agent's
		// start) is garbage the heap, still under the 4 MB of its first
		// collection, would keep for good: return it now, once. 0.27 MiB
		// of each awake intern (docs/benchmarks.md).
		debug.FreeOSMemory()
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.Close()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// ReadSecret reads the daemon secret from a file, or from
// COHORT_INTERN_SECRET. It is never a flag value: those show in ps.
func ReadSecret(file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("secret file: %w", err)
		}
		s := strings.TrimSpace(string(b))
		if s == "" {
			return "", errors.New("secret file is empty")
		}
		return s, nil
	}
	if s := os.Getenv("COHORT_INTERN_SECRET"); s != "" {
		os.Unsetenv("COHORT_INTERN_SECRET") // nothing this starts inherits it
		return s, nil
	}
	return "", errors.New("a secret is required: --secret-file or COHORT_INTERN_SECRET")
}

// readSecretFD reads the secret from an inherited descriptor (a pipe the
// provisioner wrote) and closes it, so no child inherits it.
func readSecretFD(fd int) (string, error) {
	f := os.NewFile(uintptr(fd), "secret")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", fmt.Errorf("secret descriptor: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", errors.New("secret descriptor is empty")
	}
	return s, nil
}

// EnvInt is Env for a whole number; an unparsable value is def.
func EnvInt(name string, def int) int {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// EnvDuration is Env for a duration (5m); an unparsable value is def.
func EnvDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

// installAgent prepares a known third-party agent in the intern's data
// directory (its own HOME, its configuration pointing at baseURL) and
// returns its argv and environment.
func installAgent(name, modules, baseURL, key, model, dataDir string) ([]string, []string, error) {
	p, ok := agents.Lookup(name)
	if !ok {
		return nil, nil, fmt.Errorf("--agent must be one of %s, not %q", strings.Join(KnownAgents(), ", "), name)
	}
	if modules == "" {
		return nil, nil, fmt.Errorf("--agent %s needs --agent-modules, the node_modules directory it is installed in", name)
	}
	if baseURL == "" {
		baseURL = p.Provider
	}
	if key == "" {
		// The agent insists on a key; without a jail's relay none is
		// substituted (docs/agents.md).
		key = agents.KeyPlaceholder
	}
	home, err := filepath.Abs(filepath.Join(dataDir, "home"))
	if err != nil {
		return nil, nil, err
	}
	env, err := p.Install(agents.Setup{BaseURL: baseURL, Key: key, Model: model, Home: home})
	if err != nil {
		return nil, nil, fmt.Errorf("prepare agent %s: %w", name, err)
	}
	return p.Command(modules), env, nil
}

// KnownAgents names the third-party agents --agent accepts.
func KnownAgents() []string {
	var out []string
	for _, p := range agents.All() {
		out = append(out, p.Name)
	}
	return out
}

// isBuiltInAgent reports whether argv runs this binary's own agent (which
// makes jails of its own for manual-mode commands, and so is started
// without the strict syscall filter it puts on them).
func isBuiltInAgent(argv []string, self string) bool {
	if len(argv) < 2 || argv[1] != "agent" {
		return false
	}
	a, err := os.Stat(argv[0])
	if err != nil {
		return false
	}
	b, err := os.Stat(self)
	return err == nil && os.SameFile(a, b)
}
