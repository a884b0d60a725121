package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cohort-dev/cohort/internal/httptool"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/safehttp"
)

// internCmd runs one intern's daemon: `cohort intern`.
func internCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("intern", flag.ContinueOnError)
	fs.SetOutput(stderr)
	self, err := os.Executable()
	if err != nil {
		self = "cohort"
	}
	var (
		listen       = fs.String("listen", env("COHORT_LISTEN", "127.0.0.1:0"), "address for HTTP/1.1 and h2c; loopback by default, port 0 picks one (COHORT_LISTEN)")
		dataDir      = fs.String("data-dir", env("COHORT_DATA_DIR", "./.cohort-intern"), "the intern's sessions and the agent's working directory (COHORT_DATA_DIR)")
		internID     = fs.String("intern-id", env("COHORT_INTERN_ID", ""), "the intern's id, for Status and logs (COHORT_INTERN_ID)")
		secretFile   = fs.String("secret-file", env("COHORT_INTERN_SECRET_FILE", ""), "file holding the secret callers must present; or set COHORT_INTERN_SECRET (COHORT_INTERN_SECRET_FILE)")
		agentCommand = fs.String("agent-command", env("COHORT_AGENT_COMMAND", ""), "the ACP agent to run, split on spaces; default: this executable with \"agent\" (COHORT_AGENT_COMMAND)")
		model        = fs.String("model", env("COHORT_MODEL", ""), "the model configured on the intern, passed to the agent (COHORT_MODEL)")
		deadline     = fs.Duration("interaction-deadline", envDuration("COHORT_INTERACTION_DEADLINE", 5*time.Minute), "how long a question waits before its run is cancelled (COHORT_INTERACTION_DEADLINE)")
		retain       = fs.Int("retain-events", envInt("COHORT_RETAIN_EVENTS", 10000), "events kept per run for replay (COHORT_RETAIN_EVENTS)")
		retainBytes  = fs.Int("retain-bytes", envInt("COHORT_RETAIN_BYTES", 4<<20), "bytes of events kept per run for replay (COHORT_RETAIN_BYTES)")
		maxPaused    = fs.Int("max-paused-runs", envInt("COHORT_MAX_PAUSED_RUNS", 256), "runs held open across a question; past it new turns get 503 busy (COHORT_MAX_PAUSED_RUNS)")
		initTimeout  = fs.Duration("init-timeout", envDuration("COHORT_INIT_TIMEOUT", 30*time.Second), "how long the agent may take to answer initialize (COHORT_INIT_TIMEOUT)")
		logLevel     = fs.String("log-level", env("COHORT_LOG_LEVEL", "info"), "debug, info, warn or error (COHORT_LOG_LEVEL)")
		gatewayURL   = fs.String("gateway-url", env("COHORT_GATEWAY_URL", ""), "the gateway's API base (http://host:port/api/v1): the http_request tool asks its vault for secrets with the daemon secret (COHORT_GATEWAY_URL)")
		toolCAFile   = fs.String("http-tool-ca-file", env("COHORT_HTTP_TOOL_CA_FILE", ""), "PEM certificates the http_request tool trusts besides the system roots (COHORT_HTTP_TOOL_CA_FILE)")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	log, err := newLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	secret, err := readSecret(*secretFile)
	if err != nil {
		return err
	}
	roots, err := safehttp.ExtraRootsFromFile(*toolCAFile)
	if err != nil {
		return err
	}
	argv := strings.Fields(*agentCommand)
	if len(argv) == 0 {
		argv = []string{self, "agent"}
	}
	d, err := internd.New(internd.Config{InternID: *internID, Secret: secret, DataDir: *dataDir, AgentCommand: argv,
		Model: *model, InteractionDeadline: *deadline, RetainEvents: *retain, RetainBytes: *retainBytes,
		MaxPausedRuns: *maxPaused, InitTimeout: *initTimeout, Log: log.With("intern", *internID),
		GatewayURL: *gatewayURL, HTTPTool: httptool.Options{ExtraRoots: roots}})
	if err != nil {
		return err
	}
	defer d.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	hs := internd.HTTPServer(d.Handler(), log)
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

// readSecret reads the daemon secret from a file, or from
// COHORT_INTERN_SECRET. It is never a flag value: those show in ps.
func readSecret(file string) (string, error) {
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
		return s, nil
	}
	return "", errors.New("a secret is required: --secret-file or COHORT_INTERN_SECRET")
}

func envInt(name string, def int) int {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

// internRegister records where the operator runs an intern's daemon and
// the secret it accepts; the secret is stored wrapped by the KEK.
func internRegister(ctx context.Context, e *adminEnv) error {
	if e.f.id == "" || e.f.url == "" || e.f.secretFile == "" {
		return errors.New("--id, --url and --secret-file are required")
	}
	secret, err := readSecret(e.f.secretFile)
	if err != nil {
		return err
	}
	kek, err := loadKEK(e.cfg)
	if err != nil {
		return err
	}
	p := &provision.Provisioner{DB: e.db, KEK: kek, Mode: provision.Remote}
	in, err := p.Register(ctx, e.f.id, e.f.url, secret)
	if err != nil {
		return err
	}
	return e.printOne(interns.Proto(in))
}
