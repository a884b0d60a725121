package server

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/accounts"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/buildinfo"
	"github.com/cohort-dev/cohort/internal/chat"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/federation"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/openapi"
	"github.com/cohort-dev/cohort/internal/rest"
	"github.com/cohort-dev/cohort/internal/runs"
	"github.com/cohort-dev/cohort/internal/turn"
	"github.com/cohort-dev/cohort/internal/vault"
	"github.com/cohort-dev/cohort/internal/webhooks"
	"github.com/cohort-dev/cohort/internal/workspaces"
	"github.com/cohort-dev/cohort/web"
)

// A route is one REST route or one Connect service, declared with what it
// admits (auth.Access: the credential scope and the caller checks, run
// once per request by auth.Authenticator's Handler or Interceptor).
// routes is the only place a route is registered, and New refuses to
// build a gateway with a route that declares nothing.
type route struct {
	// pattern is a REST route's ServeMux pattern, with Prefix.
	pattern string
	handler http.HandlerFunc
	// reasons: the route family's error bodies carry metadata.reason
	// (chat, vault), also for refusals of its access.
	reasons bool
	// maxBody bounds a REST route's request body before anything reads it
	// (bodyLimit); 0: the route reads no body. A Connect service's bound
	// is maxBody, or DefaultMaxBody.
	maxBody int64
	// selfBounded: the handler bounds its body and refuses encodings
	// itself, before it looks at a credential (/oauth/token).
	selfBounded bool

	// service is a Connect service's full name, and mount its handler
	// with the gateway's options.
	service string
	mount   func(...connect.HandlerOption) (string, http.Handler)
	// procedures declares a service's procedures one by one, by procedure
	// ("/cohort.v1.VaultService/PutInternSecret"); else access covers
	// every procedure of the service.
	procedures map[string]auth.Access

	access auth.Access
}

// routes declares the gateway's routes.
func (s *Server) routes() []route {
	public := auth.Access{Scope: auth.Public}
	apiKeys := auth.Access{Scope: auth.API}
	// The intern chat and its background runs are the inference routes:
	// the ones that take federation access tokens.
	inference := auth.Access{Scope: auth.Inference, Admit: func(_ context.Context, p *auth.Principal) error {
		return s.Chat.Admit(p)
	}}
	vaultAccess := func(write bool) auth.Access {
		return auth.Access{Scope: auth.API, Admit: func(ctx context.Context, p *auth.Principal) error {
			return s.Vault.Admit(p, auth.Host(ctx), write)
		}}
	}
	vaultRead, vaultWrite := vaultAccess(false), vaultAccess(true)
	// Background runs are the chat's, for the same callers: a CI job that
	// holds only its access token is the caller that cannot keep a stream
	// open for twenty minutes.
	runsAccess := auth.Access{Scope: auth.Inference, Admit: func(_ context.Context, p *auth.Principal) error {
		return s.Chat.Admit(p)
	}}

	ws := workspaces.REST{S: s.Workspaces}
	vr := vault.REST{S: s.Vault}
	chatREST := chat.REST{S: s.Chat, Runs: s.Runs, SSE: s.ChatSSE}
	chatInference := inference
	chatInference.Lookup = chatREST.Lookup
	fed := federation.REST{S: s.Federation}
	hooks := webhooks.REST{S: s.Webhooks}
	return []route{
		{service: cohortv1connect.WorkspaceServiceName, access: apiKeys, mount: func(o ...connect.HandlerOption) (string, http.Handler) {
			return cohortv1connect.NewWorkspaceServiceHandler(workspaces.Handler{S: s.Workspaces}, o...)
		}},
		{pattern: "POST " + Prefix + "/workspaces", access: apiKeys, maxBody: workspaces.MaxBody, handler: ws.Create},

		{service: cohortv1connect.AdminServiceName, access: apiKeys, mount: func(o ...connect.HandlerOption) (string, http.Handler) {
			return cohortv1connect.NewAdminServiceHandler(accounts.AdminHandler{S: s.Accounts}, o...)
		}},
		{service: cohortv1connect.InternServiceName, access: apiKeys, mount: func(o ...connect.HandlerOption) (string, http.Handler) {
			return cohortv1connect.NewInternServiceHandler(interns.Handler{S: s.Interns}, o...)
		}},

		{service: cohortv1connect.VaultServiceName, maxBody: vault.MaxBody, mount: func(o ...connect.HandlerOption) (string, http.Handler) {
			return vault.NewConnectHandler(s.Vault, o...)
		}, procedures: map[string]auth.Access{
			cohortv1connect.VaultServicePutInternSecretProcedure:       vaultWrite,
			cohortv1connect.VaultServiceDeleteInternSecretProcedure:    vaultWrite,
			cohortv1connect.VaultServiceListInternSecretsProcedure:     vaultRead,
			cohortv1connect.VaultServicePutWorkspaceSecretProcedure:    vaultWrite,
			cohortv1connect.VaultServiceDeleteWorkspaceSecretProcedure: vaultWrite,
			cohortv1connect.VaultServiceListWorkspaceSecretsProcedure:  vaultRead,
		}},
		{service: cohortv1connect.VaultAdminServiceName, access: apiKeys, mount: func(o ...connect.HandlerOption) (string, http.Handler) {
			return cohortv1connect.NewVaultAdminServiceHandler(vault.AdminHandler{S: s.Vault}, o...)
		}},
		// Interns' daemons authenticate with their own secret, not an API key.
		{service: cohortv1connect.InternGatewayServiceName, access: public, mount: func(o ...connect.HandlerOption) (string, http.Handler) {
			return vault.NewGatewayHandler(s.Vault, o...)
		}},
		{pattern: "PUT " + Prefix + "/vault/interns/{internId}/secrets/{name}", access: vaultWrite, reasons: true, maxBody: vault.MaxBody, handler: vr.Put},
		{pattern: "DELETE " + Prefix + "/vault/interns/{internId}/secrets/{name}", access: vaultWrite, reasons: true, handler: vr.DeleteIntern},
		{pattern: "GET " + Prefix + "/vault/interns/{internId}/secrets", access: vaultRead, reasons: true, handler: vr.ListIntern},
		{pattern: "PUT " + Prefix + "/vault/secrets/{name}", access: vaultWrite, reasons: true, maxBody: vault.MaxBody, handler: vr.PutWorkspace},
		{pattern: "DELETE " + Prefix + "/vault/secrets/{name}", access: vaultWrite, reasons: true, handler: vr.DeleteWorkspace},
		{pattern: "GET " + Prefix + "/vault/secrets", access: vaultRead, reasons: true, handler: vr.ListWorkspace},
		// Every other path under /vault/ passes the same gates, so that a
		// caller outside the programme gets the same plain 404 there too.
		{pattern: Prefix + "/vault/", access: vaultRead, reasons: true, handler: vr.Other},

		{service: cohortv1connect.ChatServiceName, access: inference, maxBody: turn.MaxBody, mount: func(o ...connect.HandlerOption) (string, http.Handler) {
			return cohortv1connect.NewChatServiceHandler(chat.Handler{S: s.Chat, Runs: s.Runs}, o...)
		}},
		{pattern: "POST " + Prefix + "/interns/{internId}/chat/completions", access: chatInference, reasons: true, maxBody: turn.MaxBody},
		{pattern: "GET " + Prefix + "/interns/{internId}/models", access: inference, reasons: true, handler: chatREST.Models},
		// Background runs (docs/background.md): the chat's gates and
		// callers, access tokens included.
		{service: cohortv1connect.RunServiceName, access: runsAccess, mount: func(o ...connect.HandlerOption) (string, http.Handler) {
			return cohortv1connect.NewRunServiceHandler(runs.Handler{M: s.Runs}, o...)
		}},
		{pattern: "GET " + Prefix + "/interns/{internId}/runs/{runId}", access: runsAccess, reasons: true, handler: s.Runs.Get},
		{pattern: "GET " + Prefix + "/interns/{internId}/runs/{runId}/events", access: runsAccess, reasons: true, handler: s.Runs.Events},
		{pattern: "POST " + Prefix + "/interns/{internId}/runs/{runId}/cancel", access: runsAccess, reasons: true, handler: s.Runs.Cancel},
		{pattern: "GET " + Prefix + "/interns/{internId}/sessions/{sessionId}/runs", access: runsAccess, reasons: true, handler: s.Runs.List},

		{service: cohortv1connect.FederationServiceName, access: apiKeys, mount: func(o ...connect.HandlerOption) (string, http.Handler) {
			return cohortv1connect.NewFederationServiceHandler(federation.Handler{S: s.Federation}, o...)
		}},
		// Every method reaches the token handler, so that even a 405
		// carries its no-store headers and OAuth error body. The subject
		// token is the credential.
		{pattern: Prefix + "/oauth/token", access: public, maxBody: federation.MaxTokenBody, selfBounded: true, handler: fed.Token},
		// Public like any JWKS: resource servers verifying our tokens hold no API key.
		{pattern: "GET " + Prefix + "/oauth/jwks", access: public, handler: fed.JWKS},

		{service: cohortv1connect.WebhookServiceName, access: apiKeys, maxBody: webhooks.MaxBody, mount: func(o ...connect.HandlerOption) (string, http.Handler) {
			return cohortv1connect.NewWebhookServiceHandler(webhooks.Handler{S: s.Webhooks}, o...)
		}},
		{pattern: "POST " + Prefix + "/webhooks/endpoints", access: apiKeys, reasons: true, maxBody: webhooks.MaxBody, handler: hooks.Create},
		{pattern: "GET " + Prefix + "/webhooks/endpoints", access: apiKeys, reasons: true, handler: hooks.List},
		{pattern: "GET " + Prefix + "/webhooks/endpoints/{id}", access: apiKeys, reasons: true, handler: hooks.Get},
		{pattern: "PATCH " + Prefix + "/webhooks/endpoints/{id}", access: apiKeys, reasons: true, maxBody: webhooks.MaxBody, handler: hooks.Update},
		{pattern: "DELETE " + Prefix + "/webhooks/endpoints/{id}", access: apiKeys, reasons: true, handler: hooks.Delete},
		{pattern: "POST " + Prefix + "/webhooks/endpoints/{id}/rotate-secret", access: apiKeys, reasons: true, handler: hooks.Rotate},
		{pattern: "GET " + Prefix + "/webhooks/endpoints/{id}/deliveries", access: apiKeys, reasons: true, handler: hooks.Deliveries},
		{pattern: "POST " + Prefix + "/webhooks/deliveries/{id}/redeliver", access: apiKeys, reasons: true, handler: hooks.Redeliver},

		// The OpenAPI document of the REST routes above and below (ADR
		// 0901): public, as tooling reads it before it holds a key.
		{pattern: "GET " + Prefix + "/openapi.json", access: public, handler: openapi.Serve},

		{pattern: "GET /healthz", access: public, handler: func(w http.ResponseWriter, r *http.Request) {
			rest.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		}},
		{pattern: "GET /readyz", access: public, handler: s.ready},
		{pattern: "GET /version", access: public, handler: func(w http.ResponseWriter, r *http.Request) {
			rest.WriteJSON(w, http.StatusOK, buildinfo.Get())
		}},
		// Where a scraper looks first: say where the metrics are. They are
		// never on the API's port, which faces callers.
		{pattern: "GET /metrics", access: public, handler: func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "404 not found: Prometheus metrics are served on serve's "+config.Setting("metrics-listen")+" address, off by default, never on the API's port", http.StatusNotFound)
		}},
		// The console at "/" and its files; any other path is a plain 404
		// (web.Handler), and under /api/ a 404 in the API's error shape.
		{pattern: "/", access: public, handler: web.Handler().ServeHTTP},
		{pattern: "/api/", access: public, handler: func(w http.ResponseWriter, r *http.Request) {
			rest.WriteError(w, r, apierr.New(http.StatusNotFound, apierr.ReasonNotFound, "no route for %s %s", r.Method, r.URL.Path), false)
		}},
	}
}

// ready is /readyz: the database answers; a warning (interns unjailed)
// is passed on.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	err := s.DB.PingContext(r.Context())
	// database/sql retries getting a connection, not its ping: a pooled
	// connection whose backend was terminated fails the ping once and is
	// dropped, so ping on another (a few may be dead after a restart).
	for i := 0; i < 3 && errors.Is(err, driver.ErrBadConn); i++ {
		err = s.DB.PingContext(r.Context())
	}
	if err != nil {
		// Once per outage, not once per probe.
		apierr.LogUnavailable(r.Context(), s.Log, err)
		w.Header().Set("Retry-After", strconv.Itoa(apierr.RetryUnavailable))
		rest.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "database unavailable"})
		return
	}
	body := map[string]string{"status": "ready"}
	if s.Warning != "" {
		body["warning"] = s.Warning
	}
	rest.WriteJSON(w, http.StatusOK, body)
}

// checkRoutes refuses a route that declares no access, or one that cannot
// be enforced; for Connect services it checks every procedure of the
// service's descriptor. It returns the procedures' declarations.
func checkRoutes(routes []route) (map[string]auth.Access, error) {
	procedures := map[string]auth.Access{}
	for _, rt := range routes {
		if rt.mount == nil {
			// A route with a credential lookup is served by the handler
			// its lookup returns.
			if rt.pattern == "" || (rt.handler == nil) == (rt.access.Lookup == nil) || rt.service != "" || rt.procedures != nil {
				return nil, fmt.Errorf("server: route %q is neither a REST route nor a Connect service", rt.pattern+rt.service)
			}
			if err := rt.access.Check(); err != nil {
				return nil, fmt.Errorf("server: route %q: %w", rt.pattern, err)
			}
			continue
		}
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(rt.service))
		if err != nil {
			return nil, fmt.Errorf("server: Connect service %q: %w", rt.service, err)
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok {
			return nil, fmt.Errorf("server: %q is not a service", rt.service)
		}
		seen := 0
		methods := sd.Methods()
		for i := range methods.Len() {
			proc := "/" + rt.service + "/" + string(methods.Get(i).Name())
			acc := rt.access
			if rt.procedures != nil {
				var ok bool
				if acc, ok = rt.procedures[proc]; ok {
					seen++
				}
			}
			if err := acc.Check(); err != nil {
				return nil, fmt.Errorf("server: procedure %s: %w", proc, err)
			}
			if acc.Lookup != nil {
				return nil, fmt.Errorf("server: procedure %s: a credential lookup is for REST routes", proc)
			}
			procedures[proc] = acc
		}
		if seen != len(rt.procedures) {
			return nil, fmt.Errorf("server: %s declares procedures it does not have", rt.service)
		}
		if rt.procedures != nil && rt.access.Scope != 0 {
			return nil, fmt.Errorf("server: %s declares its access twice (per service and per procedure)", rt.service)
		}
	}
	return procedures, nil
}

// mux registers every route behind what it admits.
func (s *Server) mux() (*http.ServeMux, error) {
	routes := s.routes()
	procedures, err := checkRoutes(routes)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	opts := connect.WithInterceptors(apierr.ConnectInterceptor(s.Log), s.Auth.Interceptor(procedures), noNUL{})
	for _, rt := range routes {
		if rt.mount != nil {
			limit := rt.maxBody
			if limit == 0 {
				limit = DefaultMaxBody
			}
			// connect-go's own bound is for streamed messages; a unary
			// body reaches it already bounded and inflated (bodyLimit).
			path, h := rt.mount(opts, connect.WithReadMaxBytes(int(limit)))
			if admits(rt) {
				// The caller checks may read the request's host.
				h = auth.WithHost(h)
			}
			d := door{limit: limit, connect: true, procedures: map[string]bool{}}
			for proc := range procedures {
				if strings.HasPrefix(proc, path) {
					d.procedures[proc] = true
				}
			}
			mux.Handle(Prefix+path, http.StripPrefix(Prefix, bodyLimit(d, h)))
			continue
		}
		reasons := rt.reasons
		writeErr := func(w http.ResponseWriter, r *http.Request, err error) { rest.WriteError(w, r, err, reasons) }
		d := door{limit: rt.maxBody, reasons: reasons, self: rt.selfBounded}
		mux.Handle(rt.pattern, bodyLimit(d, s.Auth.Handler(rt.access, writeErr, rt.handler)))
	}
	return mux, nil
}

// admits reports whether a service runs caller checks (Admit).
func admits(rt route) bool {
	if rt.access.Admit != nil {
		return true
	}
	for _, acc := range rt.procedures {
		if acc.Admit != nil {
			return true
		}
	}
	return false
}
