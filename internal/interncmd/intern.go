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
	"strings"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/httptool"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

// Jailed is what `cohort intern --jail` runs: the daemon's settings, to
// start it in a jail of its own.
type Jailed struct {
	// Listen, DataDir and GatewayURL are the host's: where the jail's
	// listener is, the directory it gets, the gateway its relay reaches.
	Listen, DataDir, Secret, GatewayURL string
	// ReadOnly are host paths bound read-only into the jail; Hide, host
	// paths the jail must not see.
	ReadOnly, Hide []string
	// Daemon is the daemon's launch inside the jail, less what the jail
	// sets itself (localjail.DaemonJail.Spec).
	Daemon launch.Daemon
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
	var d launch.Daemon
	d.Flags(fs)
	var (
		secretFile = fs.String("secret-file", config.Env("COHORT_INTERN_SECRET_FILE", ""), "with --jail, the file holding the daemon secret (unjailed, the agent could read it: set COHORT_INTERN_SECRET instead) (COHORT_INTERN_SECRET_FILE)")
		jailFlag   = fs.Bool("jail", config.EnvBool("COHORT_INTERN_JAIL", false), "run the daemon and its agent in a jail of their own, as the local provisioner does: for several daemons on one host (COHORT_INTERN_JAIL)")
		jailRO     = fs.String("jail-ro-bind", config.Env("COHORT_JAIL_RO_BIND", ""), "with --jail, comma-separated host paths bound read-only into the jail besides /usr, /bin, /lib and /etc (COHORT_JAIL_RO_BIND)")
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
	log, err := NewLogger(stderr, d.LogLevel)
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
	if !*jailFlag && d.SecretFD == 0 && *secretFile != "" {
		// Unjailed, the agent and its commands run as this user: a file
		// the daemon can read, they can read, and with it derive the
		// daemon's credential (ReleaseSecret: vault values).
		return errors.New("--secret-file needs --jail: without a jail the agent runs as this user and could read the file, " +
			"and with it ask the vault for this intern's secrets; run with --jail, or give the secret in COHORT_INTERN_SECRET " +
			"from a source this user cannot read (a root-owned systemd EnvironmentFile, a secret manager; docs/security.md)")
	}
	var secret string
	if d.SecretFD > 0 {
		secret, err = readSecretFD(d.SecretFD)
	} else {
		secret, err = ReadSecret(*secretFile)
	}
	if err != nil {
		return err
	}
	roots, err := safehttp.ExtraRootsFromFile(d.HTTPToolCAFile)
	if err != nil {
		return err
	}
	var proxy *url.URL
	if d.HTTPToolProxy != "" {
		if proxy, err = url.Parse(d.HTTPToolProxy); err != nil || proxy.Scheme != "http" || proxy.Host == "" {
			return fmt.Errorf("--http-tool-proxy must be http://host:port, not %q", d.HTTPToolProxy)
		}
	}
	if *jailFlag {
		if jailed == nil {
			return errors.New("--jail needs the cohort binary (this one runs only inside a jail)")
		}
		// The jail sets where the daemon listens, its directory and its
		// gateway; it passes on the rest, host paths made absolute.
		in := launch.Daemon{InternID: d.InternID, Model: d.Model, LogLevel: d.LogLevel,
			InteractionDeadline: d.InteractionDeadline, RetainEvents: d.RetainEvents, RetainBytes: d.RetainBytes,
			MaxPausedRuns: d.MaxPausedRuns, MaxPausedPerCaller: d.MaxPausedPerCaller, SessionIdleTTL: d.SessionIdleTTL,
			InitTimeout: d.InitTimeout, Agent: launch.Agent{Command: d.Agent.Command}}
		ro := config.SplitList(*jailRO)
		if d.Agent.Name != "" {
			modules, err := filepath.Abs(d.Agent.Modules)
			if err != nil {
				return err
			}
			ro = append(ro, modules)
			in.Agent.Name, in.Agent.Modules, in.Agent.KeyPlaceholder = d.Agent.Name, modules, agents.KeyPlaceholder
		}
		if d.HTTPToolCAFile != "" {
			ca, err := filepath.Abs(d.HTTPToolCAFile)
			if err != nil {
				return err
			}
			ro = append(ro, ca)
			in.HTTPToolCAFile = ca
		}
		return jailed(ctx, Jailed{Listen: d.Listen, DataDir: d.DataDir, GatewayURL: d.GatewayURL, Daemon: in,
			Secret: secret, ReadOnly: ro, Hide: []string{*secretFile}, Limits: limits}, stdout, stderr, log)
	}
	argv := strings.Fields(d.Agent.Command)
	if len(argv) == 0 {
		argv = []string{self, "agent"}
	}
	builtIn := d.Agent.Name == "" && isBuiltInAgent(argv, self)
	var agentEnv []string
	if d.Agent.Name != "" {
		if argv, agentEnv, err = installAgent(d.Agent, d.Model, d.DataDir); err != nil {
			return err
		}
	}
	dm, err := internd.New(internd.Config{InternID: d.InternID, Secret: secret, DataDir: d.DataDir, AgentCommand: argv, AgentEnv: agentEnv, AgentNests: builtIn,
		AgentKeys: []string{d.Agent.KeyPlaceholder, agents.KeyPlaceholder}, AgentAuthMethod: d.Agent.AuthMethod,
		Model: d.Model, InteractionDeadline: d.InteractionDeadline, RetainEvents: d.RetainEvents, RetainBytes: d.RetainBytes,
		MaxPausedRuns: d.MaxPausedRuns, MaxPausedPerCaller: d.MaxPausedPerCaller, SessionIdleTTL: d.SessionIdleTTL, InitTimeout: d.InitTimeout, Log: log.With("intern", d.InternID),
		GatewayURL: d.GatewayURL, HTTPTool: httptool.Options{ExtraRoots: roots, Proxy: proxy}})
	if err != nil {
		return err
	}
	defer dm.Close()
	var ln net.Listener
	if d.ListenFD > 0 {
		f := os.NewFile(uintptr(d.ListenFD), "listener")
		ln, err = net.FileListener(f)
		f.Close() // the listener holds its own descriptor, closed on exec
	} else {
		ln, err = net.Listen("tcp", d.Listen)
	}
	if err != nil {
		return err
	}
	stopTracing, err := StartTracing(ctx, "cohort-intern")
	if err != nil {
		return err
	}
	defer stopTracing()
	hs := internd.HTTPServer(telemetry.Handler(dm.Handler()), log)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(internd.BufferReads(ln)) }()
	// The first line on stdout is the address: a provisioner that passed
	// port 0 reads it to learn where the daemon listens.
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())
	log.Info("intern daemon listening", "addr", ln.Addr().String(), "intern", d.InternID)
	go func() {
		if err := dm.Start(ctx); err != nil {
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
	dm.Close()
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

// installAgent prepares a known third-party agent in the intern's data
// directory (its own HOME, its configuration pointing at baseURL) and
// returns its argv and environment.
func installAgent(a launch.Agent, model, dataDir string) ([]string, []string, error) {
	name, modules, baseURL, key := a.Name, a.Modules, a.BaseURL, a.KeyPlaceholder
	p, ok := agents.Lookup(name)
	if !ok {
		return nil, nil, fmt.Errorf("--agent must be one of %s, not %q", strings.Join(agents.KnownNames(), ", "), name)
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
