package auth

import (
	"context"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	"github.com/cohort-dev/cohort/internal/apierr"
)

// Scope is what a route asks of its caller's credential, and so which
// credential kinds it takes. internal/server declares one for every REST
// route and every Connect procedure, where it registers them.
type Scope uint8

const (
	// Public routes take no API credential: they check their own (the
	// token exchange's subject token, an intern daemon's secret) or none
	// (JWKS, health, the console's files).
	Public Scope = iota + 1
	// API routes take an API key of any kind (management, workspace,
	// personal). The route's caller checks decide what each kind may do.
	API
	// Inference routes take an API key or a federation access token acting
	// as one: the intern chat.
	Inference
)

func (s Scope) String() string {
	switch s {
	case Public:
		return "public"
	case API:
		return "api"
	case Inference:
		return "inference"
	}
	return fmt.Sprintf("undeclared(%d)", uint8(s))
}

// Reach checks that p's credential carries scope s. An API key carries
// every scope; a federation access token carries Inference alone. This is
// the one place that rule is written.
func (p *Principal) Reach(s Scope) error {
	if p.AccessToken && s != Inference {
		return AccessTokenRefused()
	}
	return nil
}

// AccessTokenRefused is the 403 of a route that does not take federation
// access tokens (anything but inference).
func AccessTokenRefused() error {
	return apierr.New(http.StatusForbidden, apierr.ReasonForbidden,
		"federation access tokens carry the inference scope only (the intern chat): use an API key")
}

// Access is what a route admits: declared once per route, enforced by
// Handler (REST) and Interceptor (Connect).
type Access struct {
	Scope Scope
	// Admit, when set, runs the route's caller checks (entitlements, key
	// kind, creator departed, the request's host) once per request, after
	// authentication and before the handler reads a body, so that a caller
	// refused learns nothing about its request. Host(ctx) is the request's
	// Host header. Not for Public routes.
	Admit func(ctx context.Context, p *Principal) error
	// Lookup, when set, resolves the credential of a REST request in place
	// of Bearer: a route that reads its own row in the key's query (the
	// chat door: BearerJoin). It returns the handler that serves the
	// request, bound to what it read (an argument, not a context value:
	// ADR 0971); the route declares no handler of its own.
	Lookup func(ctx context.Context, r *http.Request, a *Authenticator) (*Principal, http.Handler, error)
}

// Check reports a declaration that cannot be enforced.
func (acc Access) Check() error {
	switch acc.Scope {
	case Public:
		if acc.Admit != nil || acc.Lookup != nil {
			return fmt.Errorf("a public route has no principal to admit or look up")
		}
	case API, Inference:
	default:
		return fmt.Errorf("no credential scope declared")
	}
	return nil
}

type hostKey struct{}

// Host is the request's Host header, for Admit (the vault refuses its
// regional hostnames). Handler and WithHost put it in the context.
func Host(ctx context.Context) string {
	h, _ := ctx.Value(hostKey{}).(string)
	return h
}

// WithHost passes the request's Host header to a Connect door, which
// connect-go does not expose.
func WithHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), hostKey{}, r.Host)))
	})
}

// admit authenticates a request of a non-public route: the credential
// (Lookup or the header), its scope, then the route's caller checks.
func (a *Authenticator) admit(ctx context.Context, acc *Access, header string) (*Principal, error) {
	p, err := a.Bearer(ctx, header)
	if err != nil {
		return nil, err
	}
	return p, acc.gate(ctx, p)
}

// gate is everything after authentication: the scope, then Admit, which
// sees the principal in its context.
func (acc *Access) gate(ctx context.Context, p *Principal) error {
	if err := p.Reach(acc.Scope); err != nil {
		return err
	}
	if acc.Admit != nil {
		return acc.Admit(With(ctx, p), p)
	}
	return nil
}

// Handler enforces acc on a REST route: it authenticates, checks the
// scope and runs Admit before next (or the handler acc.Lookup returned),
// which finds the principal in its request's context (From). A refusal is written by writeErr, in the
// route family's error body. Public routes pass straight through.
func (a *Authenticator) Handler(acc Access, writeErr func(http.ResponseWriter, *http.Request, error), next http.Handler) http.Handler {
	if acc.Scope == Public {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), hostKey{}, r.Host)
		var p *Principal
		var err error
		h := next
		if acc.Lookup != nil {
			if p, h, err = acc.Lookup(ctx, r, a); err == nil {
				err = acc.gate(ctx, p)
			}
		} else {
			p, err = a.admit(ctx, &acc, r.Header.Get("Authorization"))
		}
		if err != nil {
			writeErr(w, r, err)
			return
		}
		h.ServeHTTP(w, r.WithContext(With(ctx, p)))
	})
}

// Interceptor enforces the access of every procedure of the Connect
// services it wraps: access maps a procedure
// ("/cohort.v1.ChatService/StreamChatCompletion") to its declaration. The
// principal is put in the context. A procedure missing from access is
// refused (internal/server refuses to start with one).
func (a *Authenticator) Interceptor(access map[string]Access) connect.Interceptor {
	return connectAuth{a: a, access: access}
}

type connectAuth struct {
	a      *Authenticator
	access map[string]Access
}

func (c connectAuth) principal(ctx context.Context, procedure, header string) (context.Context, error) {
	acc, ok := c.access[procedure]
	if !ok {
		return nil, apierr.Internal(fmt.Errorf("auth: no access declared for %s", procedure))
	}
	if acc.Scope == Public {
		return ctx, nil
	}
	p, err := c.a.admit(ctx, &acc, header)
	if err != nil {
		return nil, err
	}
	return With(ctx, p), nil
}

func (c connectAuth) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := c.principal(ctx, req.Spec().Procedure, req.Header().Get("Authorization"))
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (c connectAuth) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (c connectAuth) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := c.principal(ctx, conn.Spec().Procedure, conn.RequestHeader().Get("Authorization"))
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}
