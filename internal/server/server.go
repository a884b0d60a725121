// Package server assembles the gateway: it wires the domain services to
// their Connect and REST doors under /api/v1, plus health checks.
package server

import (
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/accounts"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/chat"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/federation"
	"github.com/cohort-dev/cohort/internal/httpx"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/metrics"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/vault"
	"github.com/cohort-dev/cohort/internal/workspaces"
	"github.com/cohort-dev/cohort/web"
)

// Prefix is the version prefix every API path carries.
const Prefix = "/api/v1"

// Server holds the gateway's services.
type Server struct {
	DB         *bun.DB
	Log        *slog.Logger
	KEK        *envelope.KEK
	Auth       *auth.Authenticator
	Accounts   *accounts.Service
	Workspaces *workspaces.Service
	Interns    *interns.Service
	// Provisioner hosts interns' daemons and dials them (the chat gateway
	// uses its Client). Nil until cmd/cohort (or a test) sets it, together
	// with Interns.Lifecycle.
	Provisioner *provision.Provisioner
	Vault       *vault.Service
	// Chat is the chat orchestration; its Daemons is set by the provisioner.
	Chat *chat.Service
	// ChatSSE tunes the chat event streams of the REST door.
	ChatSSE    sse.Options
	Federation *federation.Service
	// Warning, when set, is reported by /readyz (interns run unjailed).
	Warning string
	// Metrics, when set, counts every request (serve --metrics-listen).
	Metrics *metrics.Metrics
}

// New builds the services over db, with kek wrapping the service's own keys.
func New(db *bun.DB, kek *envelope.KEK, log *slog.Logger) *Server {
	ins := &interns.Service{DB: db}
	fed := federation.New(db, kek, log)
	return &Server{
		DB:  db,
		Log: log,
		KEK: kek,
		// Chat is the inference route: the one that takes federation access tokens.
		Auth: &auth.Authenticator{DB: db, Tokens: fed, AccessTokenProcedures: map[string]bool{
			cohortv1connect.ChatServiceStreamChatCompletionProcedure: true,
		}},
		Accounts:   &accounts.Service{DB: db},
		Workspaces: &workspaces.Service{DB: db},
		Interns:    ins,
		Vault:      &vault.Service{DB: db, KEK: kek, Interns: ins},
		Chat:       &chat.Service{Interns: ins, Limiter: mustMemoryLimiter(chat.DefaultTurnRate), Log: log},
		Federation: fed,
	}
}

// Handler returns the gateway's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	opts := connect.WithInterceptors(apierr.ConnectInterceptor(s.Log), s.Auth.ConnectInterceptor())
	mount := func(path string, h http.Handler) {
		mux.Handle(Prefix+path, http.StripPrefix(Prefix, h))
	}
	mount(cohortv1connect.NewWorkspaceServiceHandler(workspaces.Handler{S: s.Workspaces}, opts))
	mount(cohortv1connect.NewAdminServiceHandler(accounts.AdminHandler{S: s.Accounts}, opts))
	mount(cohortv1connect.NewInternServiceHandler(interns.Handler{S: s.Interns}, opts))
	mount(vault.NewConnectHandler(s.Vault, opts))
	mount(cohortv1connect.NewVaultAdminServiceHandler(vault.AdminHandler{S: s.Vault}, opts))
	// Interns' daemons authenticate with their own secret, not an API key.
	mount(vault.NewGatewayHandler(s.Vault, connect.WithInterceptors(apierr.ConnectInterceptor(s.Log))))

	ws := workspaces.REST{S: s.Workspaces, Auth: s.Auth}
	mux.HandleFunc("POST "+Prefix+"/workspaces", ws.Create)
	vr := vault.REST{S: s.Vault, Auth: s.Auth}
	mux.HandleFunc("PUT "+Prefix+"/vault/interns/{internId}/secrets/{name}", vr.Put)
	mux.HandleFunc("DELETE "+Prefix+"/vault/interns/{internId}/secrets/{name}", vr.DeleteIntern)
	mux.HandleFunc("GET "+Prefix+"/vault/interns/{internId}/secrets", vr.ListIntern)
	mux.HandleFunc("PUT "+Prefix+"/vault/secrets/{name}", vr.PutWorkspace)
	mux.HandleFunc("DELETE "+Prefix+"/vault/secrets/{name}", vr.DeleteWorkspace)
	mux.HandleFunc("GET "+Prefix+"/vault/secrets", vr.ListWorkspace)
	mux.HandleFunc(Prefix+"/vault/", vr.Other)
	mount(cohortv1connect.NewChatServiceHandler(chat.Handler{S: s.Chat}, opts, connect.WithReadMaxBytes(chat.MaxBody)))
	chatREST := chat.REST{S: s.Chat, Auth: s.Auth, SSE: s.ChatSSE}
	mux.HandleFunc("POST "+Prefix+"/interns/{internId}/chat/completions", chatREST.Completions)
	mount(cohortv1connect.NewFederationServiceHandler(federation.Handler{S: s.Federation}, opts))
	fed := federation.REST{S: s.Federation}
	// Every method reaches the token handler, so that even a 405 carries
	// its no-store headers and OAuth error body. No bearer auth: the
	// subject token is the credential.
	mux.HandleFunc(Prefix+"/oauth/token", fed.Token)
	mux.HandleFunc("GET "+Prefix+"/oauth/jwks", fed.JWKS)

	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.DB.PingContext(r.Context()); err != nil {
			s.Log.ErrorContext(r.Context(), "readiness check failed", "err", err)
			httpx.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "database unavailable"})
			return
		}
		body := map[string]string{"status": "ready"}
		if s.Warning != "" {
			body["warning"] = s.Warning
		}
		httpx.WriteJSON(w, http.StatusOK, body)
	})
	mux.Handle("/", web.Handler())
	mux.HandleFunc(Prefix+"/", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteError(w, r, apierr.New(http.StatusNotFound, "not_found", "no route for %s %s", r.Method, r.URL.Path), false)
	})
	var observe func(string, string, int, time.Duration)
	if s.Metrics != nil {
		observe = s.Metrics.Request
	}
	return httpx.AccessLog(s.Log, httpx.StreamDeadlines(mux, sse.DefaultWriteTimeout), observe)
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

// mustMemoryLimiter is an in-process limiter for a rate known to be valid.
func mustMemoryLimiter(r ratelimit.Rate) ratelimit.Limiter {
	l, err := ratelimit.NewMemory(r, nil)
	if err != nil {
		panic(err)
	}
	return l
}
