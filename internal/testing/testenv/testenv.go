// Package testenv starts a real gateway over a real database for black-box
// tests: a bootstrapped organization, its keys and an httptest server.
package testenv

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/bootstrap"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// Env is a running gateway with a bootstrapped organization.
type Env struct {
	DB     *bun.DB
	Server *server.Server
	HTTP   *httptest.Server
	// URL is the API base, ending in /api/v1.
	URL  string
	logs *lockedWriter
	bootstrap.Result
	// AdminUserID is the bootstrap admin, creator of both keys.
	AdminUserID string
}

// Config is the configuration of a test gateway: serve's defaults, with
// no provisioner (a test that needs daemons sets its own on the server).
func Config() config.Config {
	cfg := config.Default()
	cfg.Fleet.Provisioner = ""
	return cfg
}

// New bootstraps db and serves it: a gateway built by server.New from
// Config(), as `cohort serve` builds one. configure, if given, adjusts the
// server before its handler is built (test doubles: a daemon, a clock, a
// token verifier).
func New(t testing.TB, db *bun.DB, configure ...func(*server.Server)) *Env {
	t.Helper()
	return NewConfig(t, db, Config(), configure...)
}

// NewConfig is New with the test's configuration. The server is not
// started (Start): a test runs what it needs.
func NewConfig(t testing.TB, db *bun.DB, cfg config.Config, configure ...func(*server.Server)) *Env {
	t.Helper()
	ctx := context.Background()
	res, err := bootstrap.Run(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if res == nil {
		t.Fatal("database was already bootstrapped")
	}
	logs := &lockedWriter{w: &strings.Builder{}}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	kek, err := envelope.LoadOrCreate(filepath.Join(t.TempDir(), "kek.json"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(ctx, cfg, server.Deps{DB: db, KEK: kek, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	for _, c := range configure {
		c(srv)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	e := &Env{DB: db, Server: srv, HTTP: hs, URL: hs.URL + server.Prefix, logs: logs, Result: *res}
	users, err := srv.Accounts.ListUsers(ctx, auth.Operator(res.OrganizationID))
	if err != nil || len(users) == 0 {
		t.Fatalf("list users: %v", err)
	}
	e.AdminUserID = users[0].GetId()
	return e
}

// Each runs fn against a fresh Env on SQLite and on PostgreSQL.
func Each(t *testing.T, fn func(t *testing.T, e *Env)) {
	t.Helper()
	storetest.Each(t, func(t *testing.T, db *bun.DB) { fn(t, New(t, db)) })
}

// Operator is the operator principal of the bootstrapped organization.
func (e *Env) Operator() *auth.Principal {
	p := auth.Operator(e.OrganizationID)
	p.UserID = e.AdminUserID
	return p
}

// NewKey creates a key of kind for the admin user (workspace may be "").
func (e *Env) NewKey(t testing.TB, kind, workspace string) string {
	t.Helper()
	res, err := e.Server.Accounts.CreateAPIKey(context.Background(), e.Operator(),
		&cohortv1.CreateApiKeyRequest{Kind: kind, WorkspaceId: workspace})
	if err != nil {
		t.Fatal(err)
	}
	return res.GetKey()
}

// Do sends a request with a bearer key (none when key is "") and returns the
// status and body.
func (e *Env) Do(t testing.TB, method, path, key, contentType, body string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, e.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := e.HTTP.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b), res.Header
}

// Logs returns every log line the gateway has written so far.
func (e *Env) Logs() string { return e.logs.String() }

// TakeLogs returns the log lines written since the last TakeLogs and
// forgets them.
func (e *Env) TakeLogs() string { return e.logs.take() }

// HTTPClient is the client to use with connect-go clients against URL.
func (e *Env) HTTPClient() *http.Client { return e.HTTP.Client() }

// Server builds a gateway over db and kek as `cohort serve` does (from
// Config(), logging nowhere), closed when the test ends: a second replica
// over an Env's database, or a server without an Env.
func Server(t testing.TB, db *bun.DB, kek *envelope.KEK) *server.Server {
	t.Helper()
	srv, err := server.New(context.Background(), Config(), server.Deps{DB: db, KEK: kek, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}
