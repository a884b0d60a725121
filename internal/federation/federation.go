// Package federation implements workload identity federation: the
// settings an organization admin edits (trusted issuers and the policies
// that map their tokens to a workspace API key), the RFC 8693 token
// exchange that checks an identity provider's JWT against a policy, the
// ES256 access tokens it issues (RFC 9068) and their verification, and the
// audit of exchanges.
//
// Doors: connect.go (FederationService) and rest.go (POST /oauth/token,
// GET /oauth/jwks). Outbound fetches go through internal/safehttp; the
// per-address exchange limit through internal/ratelimit.
package federation

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/store"
)

var errNoRows = sql.ErrNoRows

// Settings tune the service. Zero fields take the defaults below; set
// them before the service handles its first request.
type Settings struct {
	// TokenIssuer is the iss and aud of issued access tokens. Set it to
	// the service's public base URL in production.
	TokenIssuer string
	// HTTPClient fetches discovery documents and JWKS. It must be a
	// safehttp client (the default); tests give one that trusts their
	// TLS issuer and may reach loopback.
	HTTPClient *http.Client
	// Limiter limits exchanges per source address, and per intern for
	// requests relayed from a jail (default: in memory,
	// DefaultExchangeRate).
	Limiter ratelimit.Limiter
	// FetchTimeout bounds one discovery or JWKS fetch.
	FetchTimeout time.Duration
	// JWKSCooldown is the shortest time between two JWKS fetches of one
	// issuer caused by unknown kids, and how long a failed first fetch
	// is remembered before it is tried again.
	JWKSCooldown time.Duration
	// JWKSRefresh is how often a cached JWKS is refreshed in the
	// background.
	JWKSRefresh time.Duration
	// Leeway is the clock skew allowed on the subject token's nbf. Its
	// exp gets none: an expired token is expired.
	Leeway time.Duration
	// KeyRotation is how long one signing key signs; KeyPrepublish how
	// long before that a new key is published.
	KeyRotation   time.Duration
	KeyPrepublish time.Duration
	// AuditRetention is how long exchange audit rows are kept.
	AuditRetention time.Duration
}

// Defaults for Settings.
const (
	DefaultTokenIssuer    = "cohort"
	DefaultFetchTimeout   = 5 * time.Second
	DefaultJWKSCooldown   = 30 * time.Second
	DefaultJWKSRefresh    = 15 * time.Minute
	DefaultLeeway         = 30 * time.Second
	DefaultKeyRotation    = 24 * time.Hour
	DefaultKeyPrepublish  = 2 * time.Hour
	DefaultAuditRetention = 30 * 24 * time.Hour
)

// DefaultExchangeRate is the per-address exchange limit when none is
// configured: a CI fleet behind one NAT exchanging once per job fits.
var DefaultExchangeRate = ratelimit.PerMinute(60)

// Service is workload identity federation over the store.
type Service struct {
	DB *bun.DB
	// Reads, when set, is a read-only pool the exchange's lookups use
	// (SQLite's single-connection DB would queue them: docs/benchmarks.md).
	Reads *sql.DB
	KEK   *envelope.KEK
	Log   *slog.Logger
	// Now is the clock (nil: the wall clock); tests move it.
	Now func() time.Time
	// Config holds the tunables; see Settings.
	Config Settings
	// OnExchange, when set, counts each exchange by outcome ("issued",
	// "refused") and the check that refused it (internal/metrics).
	OnExchange func(outcome, failedCheck string)

	defaultsOnce sync.Once
	defLimiter   ratelimit.Limiter
	defClient    *http.Client

	policyStmt        preparedStmt
	policyOrgStmt     preparedStmt
	policyVersionStmt preparedStmt
	policies          policyCache

	conds  conditionCache
	stores keyStores
	signer signer
	audit  auditWriter
}

// New returns the service with default settings.
func New(db *bun.DB, kek *envelope.KEK, log *slog.Logger) *Service {
	s := &Service{DB: db, KEK: kek, Log: log}
	s.stores.s = s
	s.signer.s = s
	s.audit.s = s
	return s
}

var _ auth.TokenVerifier = (*Service)(nil)

func (s *Service) now() time.Time { return store.Now(s.Now) }

func (s *Service) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// settings returns Config with defaults filled in.
func (s *Service) settings() Settings {
	s.defaultsOnce.Do(func() {
		s.defLimiter, _ = ratelimit.NewMemory(DefaultExchangeRate, nil)
		s.defClient = safehttp.New(safehttp.Options{})
	})
	c := s.Config
	if c.TokenIssuer == "" {
		c.TokenIssuer = DefaultTokenIssuer
	}
	if c.HTTPClient == nil {
		c.HTTPClient = s.defClient
	}
	if c.Limiter == nil {
		c.Limiter = s.defLimiter
	}
	if c.FetchTimeout <= 0 {
		c.FetchTimeout = DefaultFetchTimeout
	}
	if c.JWKSCooldown <= 0 {
		c.JWKSCooldown = DefaultJWKSCooldown
	}
	if c.JWKSRefresh <= 0 {
		c.JWKSRefresh = DefaultJWKSRefresh
	}
	if c.Leeway < 0 {
		c.Leeway = 0
	} else if c.Leeway == 0 {
		c.Leeway = DefaultLeeway
	}
	if c.KeyRotation <= 0 {
		c.KeyRotation = DefaultKeyRotation
	}
	if c.KeyPrepublish <= 0 || c.KeyPrepublish >= c.KeyRotation {
		c.KeyPrepublish = min(DefaultKeyPrepublish, c.KeyRotation/2)
	}
	if c.AuditRetention <= 0 {
		c.AuditRetention = DefaultAuditRetention
	}
	return c
}

// Run does the periodic work until ctx ends: it creates the next signing
// key on schedule, writes pending audit rows, forgets idle key stores and
// deletes audit rows past retention. `cohort serve` runs it; everything it
// does also happens lazily when needed, so tests need not. A pass that
// fails is logged and tried again; Run returns nil when ctx ends (the
// gateway's loops, ADR 0971).
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	s.Maintain(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Maintain(ctx)
		}
	}
}

// Maintain does one pass of the periodic work: rotate signing keys, write
// pending audit rows, drop key stores idle for an hour, delete audit rows
// past retention and signing keys retired for a day (their private part
// is no longer needed by anyone).
func (s *Service) Maintain(ctx context.Context) {
	now := s.now()
	if err := s.signer.reload(ctx); err != nil {
		s.log().ErrorContext(ctx, "federation: signing key rotation failed", "err", err)
	}
	s.audit.flush(ctx)
	s.stores.sweep(now.Add(-time.Hour))
	cfg := s.settings()
	if _, err := s.DB.NewDelete().Model((*store.FederationExchange)(nil)).
		Where("at < ?", now.Add(-cfg.AuditRetention)).Exec(ctx); err != nil {
		s.log().ErrorContext(ctx, "federation: audit retention failed", "err", err)
	}
	if _, err := s.DB.NewDelete().Model((*store.SigningKey)(nil)).
		Where("publish_until < ?", now.Add(-24*time.Hour)).Exec(ctx); err != nil {
		s.log().ErrorContext(ctx, "federation: deleting retired signing keys failed", "err", err)
	}
}

// Close stops the key stores' refresh goroutines, writes pending audit
// rows and ends the audit's writer (an exchange after it gets no token).
func (s *Service) Close() {
	s.stores.closeAll()
	s.audit.close()
	for _, p := range []*preparedStmt{&s.policyStmt, &s.policyOrgStmt, &s.policyVersionStmt, &s.audit.stmt, &s.audit.chunkStmt} {
		if p.stmt != nil {
			p.stmt.Close()
		}
	}
}

// requireAdmin admits a management key (or the operator) of an
// organization with the workload identity entitlement. Access tokens never
// get here: the service's routes are declared for API keys (auth.API).
func requireAdmin(p *auth.Principal) error {
	if p == nil {
		return apierr.Unauthenticated("missing API key")
	}
	if !p.IsManagement() {
		return apierr.Forbidden("workload identity settings require a management key")
	}
	if !p.WorkloadIdentity {
		return apierr.Forbidden("workload identity federation is an Enterprise feature that is not enabled for this organization")
	}
	return nil
}
