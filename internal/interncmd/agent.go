package interncmd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/cohort-dev/cohort/internal/builtinagent"
	"github.com/cohort-dev/cohort/internal/builtinagent/sandbox"
	"github.com/cohort-dev/cohort/internal/config"
)

// Agent runs `cohort agent`: the built-in ACP agent on stdin/stdout. Logs
// go to stderr, since stdout carries the protocol.
func Agent(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	oneProc()
	cfg := builtinagent.Config{}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Model, "model", config.Env("COHORT_AGENT_MODEL", builtinagent.DemoModelID), "default model id of new sessions; cohort/demo is offline (COHORT_AGENT_MODEL)")
	fs.StringVar(&cfg.BaseURL, "base-url", config.Env("COHORT_AGENT_BASE_URL", os.Getenv("OPENAI_BASE_URL")), "OpenAI-compatible endpoint, e.g. https://host/v1 (COHORT_AGENT_BASE_URL, OPENAI_BASE_URL)")
	fs.StringVar(&cfg.WorkDir, "workdir", config.Env("COHORT_AGENT_WORKDIR", ""), "work directory of shell commands when the client's session cwd is not a directory (COHORT_AGENT_WORKDIR)")
	fs.StringVar(&cfg.StateDir, "state-dir", config.Env("COHORT_AGENT_STATE_DIR", ""), "directory keeping session histories; enables session/load (COHORT_AGENT_STATE_DIR)")
	fs.DurationVar(&cfg.IdleTimeout, "model-timeout", builtinagent.DefaultIdleTimeout, "longest wait for the model's first byte and between its chunks")
	fs.DurationVar(&cfg.SessionIdleTTL, "session-idle-ttl", config.EnvDuration("COHORT_AGENT_SESSION_IDLE_TTL", 30*time.Minute), "with --state-dir, a session without a prompt this long leaves memory; its file brings it back (COHORT_AGENT_SESSION_IDLE_TTL)")
	fs.IntVar(&cfg.MaxRetries, "model-retries", builtinagent.DefaultMaxRetries, "retries of a model call that failed before streaming (connection errors, 429, 5xx)")
	fs.DurationVar(&cfg.ShellTimeout, "shell-timeout", sandbox.DefaultTimeout, "longest run of one shell command")
	fs.IntVar(&cfg.MaxToolOutput, "shell-max-output", sandbox.DefaultMaxOutput, "bytes of a shell command's output the model sees")
	modelSocket := fs.String("model-socket", config.Env("COHORT_AGENT_MODEL_SOCKET", ""), "a unix socket that reaches the model endpoint's host, dialed instead of its address (a gVisor sandbox's model relay, ADR 0986; COHORT_AGENT_MODEL_SOCKET)")
	logLevel := fs.String("log-level", config.Env("COHORT_LOG_LEVEL", "info"), "debug, info, warn or error (COHORT_LOG_LEVEL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *modelSocket != "" {
		cfg.HTTPClient = socketClient(*modelSocket)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("agent: unexpected argument %q", fs.Arg(0))
	}
	// The key is read from the environment only, never from a flag (which
	// would show in the process list), and is never logged.
	cfg.APIKey = config.Env("COHORT_AGENT_API_KEY", os.Getenv("OPENAI_API_KEY"))
	log, err := NewLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	cfg.Logger = log
	stopTracing, err := StartTracing(ctx, "cohort-agent")
	if err != nil {
		return err
	}
	defer stopTracing()
	log.Info("agent: starting", "model", cfg.Model, "base_url", redactURL(cfg.BaseURL), "api_key_set", cfg.APIKey != "",
		"model_socket", *modelSocket, "state_dir", cfg.StateDir)
	// Whether commands can run confined is not probed at start: the probe
	// makes a jail (38 ms of a gVisor sandbox's wake, measured), and a
	// confined command that cannot get its jail says so itself
	// (sandbox.ErrUnavailable).
	err = builtinagent.Serve(ctx, cfg, stdin, stdout)
	if err == context.Canceled {
		return nil
	}
	return err
}

// socketClient is an HTTP client whose every connection is to the unix
// socket at path, with no proxy: the socket is the way to the host.
func socketClient(path string) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	var d net.Dialer
	t.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "unix", path)
	}
	return &http.Client{Transport: t}
}

// redactURL drops user information from a URL before it is logged.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable)"
	}
	if u.User != nil {
		u.User = url.User("redacted")
	}
	return u.String()
}
