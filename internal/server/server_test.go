package server

import (
	"context"
	"flag"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/chat"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/kubepods"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/provision/remote"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

func deps(t *testing.T) Deps {
	t.Helper()
	kek, err := envelope.LoadOrCreate(filepath.Join(t.TempDir(), "kek.json"))
	if err != nil {
		t.Fatal(err)
	}
	return Deps{DB: storetest.SQLite(t), KEK: kek, Log: slog.New(slog.DiscardHandler)}
}

// noProvisioner is serve's defaults without a provisioner.
func noProvisioner() config.Config {
	cfg := config.Default()
	cfg.Fleet.Provisioner = ""
	return cfg
}

func newServer(t *testing.T, cfg config.Config, d Deps) *Server {
	t.Helper()
	s, err := New(context.Background(), cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Every route and every procedure of every mounted service declares what
// it admits; a route or procedure that declares nothing, or a declaration
// that cannot be enforced, stops the gateway from being built, naming it.
func TestRoutesAreDeclared(t *testing.T) {
	t.Parallel()
	s := newServer(t, noProvisioner(), deps(t))
	routes := s.routes()
	procedures, err := checkRoutes(routes)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := procedures[cohortv1connect.VaultServiceListWorkspaceSecretsProcedure]; !ok || len(procedures) < 30 {
		t.Fatalf("%d procedures declared", len(procedures))
	}
	handler := func(http.ResponseWriter, *http.Request) {}
	mount := func(o ...connect.HandlerOption) (string, http.Handler) {
		return cohortv1connect.NewChatServiceHandler(chat.Handler{}, o...)
	}
	for want, rt := range map[string]route{
		`"POST /api/v1/new"`: {pattern: "POST /api/v1/new", handler: handler},
		`"GET /api/v1/x": a public route has no principal`: {pattern: "GET /api/v1/x", handler: handler,
			access: auth.Access{Scope: auth.Public, Admit: func(context.Context, *auth.Principal) error { return nil }}},
		"procedure /cohort.v1.ChatService/StreamChatCompletion": {service: cohortv1connect.ChatServiceName, mount: mount},
		"ChatService declares procedures it does not have": {service: cohortv1connect.ChatServiceName, mount: mount,
			procedures: map[string]auth.Access{
				cohortv1connect.ChatServiceStreamChatCompletionProcedure: {Scope: auth.Inference},
				"/cohort.v1.ChatService/Gone":                            {Scope: auth.API},
			}},
		`"cohort.v1.NoService"`: {service: "cohort.v1.NoService", mount: mount, access: auth.Access{Scope: auth.API}},
	} {
		_, err := checkRoutes(append(routes[:len(routes):len(routes)], rt))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error naming %s, got %v", want, err)
		}
	}
}

// Federation access tokens carry the inference scope: the intern chat and
// its background runs, on both doors, are the only routes declared for it.
func TestOnlyTheChatTakesAccessTokens(t *testing.T) {
	t.Parallel()
	s := newServer(t, noProvisioner(), deps(t))
	routes := s.routes()
	procedures, err := checkRoutes(routes)
	if err != nil {
		t.Fatal(err)
	}
	var inference []string
	for proc, acc := range procedures {
		if acc.Scope == auth.Inference {
			inference = append(inference, proc)
		}
	}
	for _, rt := range routes {
		if rt.mount == nil && rt.access.Scope == auth.Inference {
			inference = append(inference, rt.pattern)
		}
	}
	sort.Strings(inference)
	want := []string{
		"GET /api/v1/interns/{internId}/runs/{runId}", "GET /api/v1/interns/{internId}/runs/{runId}/events",
		"GET /api/v1/interns/{internId}/sessions/{sessionId}/runs", "POST /api/v1/interns/{internId}/chat/completions",
		"GET /api/v1/interns/{internId}/models",
		"POST /api/v1/interns/{internId}/runs/{runId}/cancel",
		cohortv1connect.ChatServiceStreamChatCompletionProcedure,
		cohortv1connect.RunServiceCancelRunProcedure, cohortv1connect.RunServiceGetRunProcedure,
		cohortv1connect.RunServiceListSessionRunsProcedure, cohortv1connect.RunServiceStreamRunEventsProcedure,
	}
	sort.Strings(want)
	if strings.Join(inference, "\n") != strings.Join(want, "\n") {
		t.Fatalf("access tokens reach\n%s\nwant the chat, its models and its runs alone:\n%s", strings.Join(inference, "\n"), strings.Join(want, "\n"))
	}
}

// The federation's settings: a malformed rate, an unreachable Redis and a
// missing CA file stop New; otherwise the issuer is applied and the limits
// live in Redis when one is configured.
func TestNewFederationSettings(t *testing.T) {
	t.Parallel()
	d := deps(t)
	ctx := context.Background()
	for name, change := range map[string]func(*config.Config){
		"bad exchange rate": func(c *config.Config) { c.Federation.ExchangeRate = "fast" },
		"bad turn rate":     func(c *config.Config) { c.Chat.TurnRate = "fast" },
		"redis unreachable": func(c *config.Config) { c.Store.RedisURL = "redis://127.0.0.1:1/0" },
		"missing CA file":   func(c *config.Config) { c.Federation.ExtraCAFile = filepath.Join(t.TempDir(), "none.pem") },
		"bad allow list":    func(c *config.Config) { c.Federation.AllowHosts = []string{"10.0.0.0/40"} },
		"bad agent":         func(c *config.Config) { c.Agents.Custom = []string{"no command"} },
	} {
		cfg := noProvisioner()
		change(&cfg)
		if s, err := New(ctx, cfg, d); err == nil {
			s.Close()
			t.Errorf("%s: accepted", name)
		}
	}
	cfg := noProvisioner()
	cfg.Store.RedisURL, cfg.Federation.TokenIssuer, cfg.Federation.ExchangeRate = "redis://127.0.0.1:6379/0", "https://api.cohort.example", "5/s,burst=10"
	s, err := New(ctx, cfg, d)
	if err != nil {
		t.Fatalf("Redis must run at 127.0.0.1:6379: %v", err)
	}
	defer s.Close()
	if s.Federation.Config.TokenIssuer != "https://api.cohort.example" {
		t.Fatal("token issuer not applied")
	}
	if _, ok := s.Federation.Config.Limiter.(*ratelimit.Redis); !ok {
		t.Fatalf("limiter %T, want Redis", s.Federation.Config.Limiter)
	}
	if _, ok := s.Chat.Limiter.(*ratelimit.Redis); !ok {
		t.Fatalf("turn limiter %T, want Redis", s.Chat.Limiter)
	}
}

// New wires the provisioner it is configured with into the services that
// use it, and the metrics hooks; it refuses a local provisioner without a
// jail unless the operator chose to run interns unjailed.
func TestNewWiresTheProvisioner(t *testing.T) {
	t.Parallel()
	d := deps(t)
	ctx := context.Background()
	s := newServer(t, noProvisioner(), d)
	if s.Provisioner != nil || s.Chat.Daemons != nil || s.Interns.Lifecycle != nil || s.Metrics != nil || s.Warning != "" {
		t.Fatalf("no provisioner configured: %+v", s)
	}
	if _, ok := s.Chat.Limiter.(*ratelimit.Memory); !ok {
		t.Fatalf("turn limiter %T, want memory", s.Chat.Limiter)
	}

	cfg := noProvisioner()
	cfg.Fleet.Provisioner, cfg.Server.MetricsListen, cfg.Server.RegionalHosts = remote.Name, "127.0.0.1:0", []string{"eu.api.example.com"}
	s = newServer(t, cfg, d)
	if s.Provisioner == nil || s.Chat.Daemons != s.Provisioner || s.Interns.Lifecycle != s.Provisioner || s.Provisioner.Backend != s.Backend {
		t.Fatalf("remote provisioner not wired: %+v", s)
	}
	if _, ok := s.Backend.(*remote.Backend); !ok {
		t.Fatalf("remote provisioner not wired: %+v", s)
	}
	if s.Metrics == nil || s.Chat.Observer == nil || s.Federation.OnExchange == nil || s.Vault.Observe == nil || s.Provisioner.OnWake == nil {
		t.Fatal("metrics hooks not set")
	}
	if len(s.Vault.RegionalHosts) != 1 {
		t.Fatal("regional hosts not applied")
	}

	for _, bad := range []string{"cloud", kubepods.Name} {
		cfg := noProvisioner()
		cfg.Fleet.Provisioner = bad
		if s, err := New(ctx, cfg, d); err == nil {
			s.Close()
			t.Errorf("provisioner %q accepted (without its cluster)", bad)
		}
	}
	cfg = noProvisioner()
	cfg.Fleet.Provisioner, cfg.Store.DataDir = localjail.Name, t.TempDir()
	if s, err := New(ctx, cfg, d); err == nil {
		s.Close()
		t.Fatal("a local provisioner without a jail was accepted")
	}
	d.Setup = localSetup(t, cfg, "--unsafe-shared-host")
	s = newServer(t, cfg, d)
	lb, ok := s.Backend.(*localjail.Backend)
	if s.Provisioner == nil || !ok || lb.Jail != nil || lb.Agents.ModelKey == nil || s.Warning != localjail.UnsafeSharedHostWarning {
		t.Fatalf("unsafe shared host: %+v", s)
	}
	if len(lb.Command) != 0 {
		t.Fatalf("without an intern binary, interns run from this executable, not %q", lb.Command)
	}
	// The binary serve chose (localjail.InternBinary) runs the interns.
	const bin = "/opt/cohort/cohort-intern"
	d.Setup = localSetup(t, cfg, "--unsafe-shared-host", "--intern-binary", bin)
	s = newServer(t, cfg, d)
	if lb := s.Backend.(*localjail.Backend); !slices.Equal(lb.Command, []string{bin}) {
		t.Fatalf("interns run from %q, want %s", lb.Command, bin)
	}
}

// localSetup is the local backend's setup of these flags, checked.
func localSetup(t *testing.T, cfg config.Config, args ...string) provision.Setup {
	t.Helper()
	k, err := provision.Lookup(localjail.Name)
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("local", flag.ContinueOnError)
	setup := k.Flags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := setup.Check(cfg); err != nil {
		t.Fatal(err)
	}
	return setup
}

// The gateway's loops run under one group (ADR 0971): a stop, by Close or
// by the end of Start's context, is reported as nil, not as a failure.
func TestLoopsEndAtClose(t *testing.T) {
	t.Parallel()
	for name, stop := range map[string]func(*Server, context.CancelFunc){
		"Close":       func(s *Server, _ context.CancelFunc) { s.Close() },
		"context end": func(_ *Server, cancel context.CancelFunc) { cancel() },
	} {
		s := newServer(t, noProvisioner(), deps(t))
		ctx, cancel := context.WithCancel(context.Background())
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		stop(s, cancel)
		if err := <-s.Failed(); err != nil {
			t.Errorf("%s: the loops ended with %v, want nil", name, err)
		}
		cancel()
	}
}
