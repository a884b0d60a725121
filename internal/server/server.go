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
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/federation"
	"github.com/cohort-dev/cohort/internal/httpx"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/workspaces"
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
	Federation *federation.Service
}

// New builds the services over db, with kek wrapping the service's own keys.
func New(db *bun.DB, kek *envelope.KEK, log *slog.Logger) *Server {
	fed := federation.New(db, kek, log)
	return &Server{
		DB:         db,
		Log:        log,
		KEK:        kek,
		Auth:       &auth.Authenticator{DB: db, Tokens: fed},
		Accounts:   &accounts.Service{DB: db},
		Workspaces: &workspaces.Service{DB: db},
		Interns:    &interns.Service{DB: db},
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
	mount(cohortv1connect.NewFederationServiceHandler(federation.Handler{S: s.Federation}, opts))

	ws := workspaces.REST{S: s.Workspaces, Auth: s.Auth}
	mux.HandleFunc("POST "+Prefix+"/workspaces", ws.Create)
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
		httpx.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.HandleFunc(Prefix+"/", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteError(w, r, apierr.New(http.StatusNotFound, "not_found", "no route for %s %s", r.Method, r.URL.Path), false)
	})
	return httpx.AccessLog(s.Log, mux)
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
