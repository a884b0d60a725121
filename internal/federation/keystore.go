package federation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"golang.org/x/time/rate"

	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/store"
)

// errUnavailable means the issuer's discovery document or JWKS could not be
// fetched: the exchange answers 503 temporarily_unavailable.
var errUnavailable = errors.New("identity provider keys unavailable")

// keyStores holds one JWKS key store per issuer. A store is keyed by the
// issuer's id and revision: when an admin changes the issuer (any replica,
// since the revision is read with the policy on every exchange) or deletes
// it, the old store is cancelled, which stops its refresh goroutine.
type keyStores struct {
	s *Service

	mu     sync.Mutex
	stores map[string]*keyStore
}

// keyStore is one issuer's cached JWKS. ready is closed once the first
// fetch finished; err is then set if it failed, and the store is kept as a
// negative cache until failedUntil so a down identity provider is not
// fetched on every exchange.
type keyStore struct {
	revision int64
	ready    chan struct{}
	cancel   context.CancelFunc

	kf          keyfunc.Keyfunc
	err         error
	failedUntil time.Time
	lastUsed    atomic.Int64 // unix nanoseconds

	// refreshFailedAt is when a refresh (unknown kid or background)
	// last failed; within a cooldown an unknown kid then answers 503.
	refreshFailedAt atomic.Int64
}

type fetchFailureKey struct{}

// fetchFailure collects, through the request context, a refresh error that
// jwkset reports to its error handler instead of returning.
type fetchFailure struct{ err error }

// get returns the ready key store for the issuer, building it (discovery,
// then the first JWKS fetch) if needed. Concurrent callers share one build.
func (k *keyStores) get(ctx context.Context, iss *store.FederationIssuer) (*keyStore, error) {
	now := k.s.now()
	k.mu.Lock()
	if k.stores == nil {
		k.stores = map[string]*keyStore{}
	}
	ks := k.stores[iss.ID]
	if ks != nil && ks.revision != iss.Revision {
		ks.cancel()
		ks = nil
	}
	if ks != nil {
		select {
		case <-ks.ready:
			if ks.err != nil && !now.Before(ks.failedUntil) {
				// The negative cache ran out: try again.
				ks.cancel()
				ks = nil
			}
		default:
		}
	}
	if ks == nil {
		ctx, cancel := context.WithCancel(context.Background())
		ks = &keyStore{revision: iss.Revision, ready: make(chan struct{}), cancel: cancel}
		k.stores[iss.ID] = ks
		go k.build(ctx, ks, *iss)
	}
	k.mu.Unlock()

	ks.lastUsed.Store(now.UnixNano())
	select {
	case <-ks.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if ks.err != nil {
		return nil, ks.err
	}
	return ks, nil
}

// build runs discovery (when the issuer has no JWKS URL), fetches the
// issuer's JWKS and creates its keyfunc.
func (k *keyStores) build(ctx context.Context, ks *keyStore, iss store.FederationIssuer) {
	defer close(ks.ready)
	cfg := k.s.settings()
	fail := func(err error) {
		// %w twice: evaluate tells a policy refusal (never succeeds)
		// from an outage (retry) by the safehttp error inside.
		ks.err = fmt.Errorf("%w: %w", errUnavailable, err)
		ks.failedUntil = k.s.now().Add(cfg.JWKSCooldown)
		if errors.Is(err, safehttp.ErrRefusedAddress) {
			k.s.log().Warn("federation: the egress policy refuses the issuer's address; its exchanges will not succeed unless --federation-allow-hosts lists it",
				"issuer_id", iss.ID, "err", err)
			return
		}
		k.s.log().Warn("federation: issuer keys unavailable", "issuer_id", iss.ID, "err", err)
	}
	fctx, cancel := context.WithTimeout(ctx, cfg.FetchTimeout)
	defer cancel()
	jwksURL := iss.JWKSURL
	if jwksURL == "" {
		u, err := discover(fctx, cfg.HTTPClient, iss.IssuerURL)
		if err != nil {
			fail(err)
			return
		}
		jwksURL = u
	}
	onRefreshError := func(ctx context.Context, err error) {
		ks.refreshFailedAt.Store(k.s.now().UnixNano())
		if f, ok := ctx.Value(fetchFailureKey{}).(*fetchFailure); ok {
			f.err = err
			return
		}
		k.s.log().Warn("federation: JWKS refresh failed", "issuer_id", iss.ID, "err", err)
	}
	// This is what keyfunc.NewDefaultOverrideCtx assembles, with its
	// defaults overridden: our guarded client and timeout; a failing first
	// fetch reported (503) instead of hidden; a background refresh every
	// JWKSRefresh; and, instead of a limiter that makes callers with an
	// unknown kid wait (one refresh per 5 minutes, waiting up to a
	// minute), a refresh that never waits behind the non-blocking gate
	// below. Building the two storages here also gives the gate the cached
	// storage, to look keys up without copying the set.
	cached, err := jwkset.NewStorageFromHTTP(jwksURL, jwkset.HTTPClientStorageOptions{
		Client:              cfg.HTTPClient,
		Ctx:                 ctx,
		HTTPTimeout:         cfg.FetchTimeout,
		RefreshInterval:     cfg.JWKSRefresh,
		RefreshErrorHandler: onRefreshError,
	})
	if err != nil {
		fail(err)
		return
	}
	refreshing, err := jwkset.NewHTTPClient(jwkset.HTTPClientOptions{
		HTTPURLs:          map[string]jwkset.Storage{jwksURL: cached},
		RefreshUnknownKID: rate.NewLimiter(rate.Inf, 1),
		// Bounds the refresh request, which runs with the caller's
		// context and this deadline.
		RateLimitWaitMax: cfg.FetchTimeout,
	})
	if err != nil {
		fail(err)
		return
	}
	gate := &gatedStorage{Storage: refreshing, cached: cached, ks: ks, s: k.s, cooldown: rate.NewLimiter(rate.Every(cfg.JWKSCooldown), 1)}
	// The first fetch just happened: it counts as this cooldown's fetch.
	// The cooldown runs on the service's clock (tests move it).
	gate.cooldown.AllowN(k.s.now(), 1)
	ks.kf, err = keyfunc.New(keyfunc.Options{Ctx: ctx, Storage: gate, UseWhitelist: []jwkset.USE{jwkset.UseSig, ""}})
	if err != nil {
		fail(err)
	}
}

// gatedStorage serves keys from the cached JWKS and, on an unknown kid,
// refreshes it at most once per cooldown. A kid that arrives while the
// cooldown runs fails at once instead of queueing behind a limiter: a
// burst of tokens with random kids costs one fetch, and no one waits.
type gatedStorage struct {
	jwkset.Storage // refreshes on a miss
	cached         jwkset.Storage
	ks             *keyStore
	s              *Service
	cooldown       *rate.Limiter
}

// KeyRead implements jwkset.Storage.
func (g *gatedStorage) KeyRead(ctx context.Context, kid string) (jwkset.JWK, error) {
	// The cached storage's KeyRead is a lookup; it never fetches.
	if j, err := g.cached.KeyRead(ctx, kid); err == nil || !errors.Is(err, jwkset.ErrKeyNotFound) {
		return j, err
	}
	if !g.cooldown.AllowN(g.s.now(), 1) {
		if failed := g.ks.refreshFailedAt.Load(); failed != 0 &&
			g.s.now().Sub(time.Unix(0, failed)) < g.s.settings().JWKSCooldown {
			return jwkset.JWK{}, fmt.Errorf("%w: the last JWKS refresh failed", errUnavailable)
		}
		return jwkset.JWK{}, fmt.Errorf("%w: kid %q (refresh cooling down)", jwkset.ErrKeyNotFound, truncate(kid, 64))
	}
	f := &fetchFailure{}
	j, err := g.Storage.KeyRead(context.WithValue(ctx, fetchFailureKey{}, f), kid)
	if f.err != nil {
		return jwkset.JWK{}, fmt.Errorf("%w: JWKS refresh: %w", errUnavailable, f.err)
	}
	return j, err
}

// discovery is the part of an OpenID Provider configuration we read.
type discovery struct {
	Issuer  string `json:"issuer"`
	JWKSURI string `json:"jwks_uri"`
}

// discover reads jwks_uri from the issuer's
// /.well-known/openid-configuration. The document's issuer must equal the
// configured issuer URL exactly (OpenID Connect Discovery §4.3), so that a
// document served at one URL cannot speak for another issuer.
func discover(ctx context.Context, client *http.Client, issuer string) (string, error) {
	u := strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", fmt.Errorf("discovery: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("discovery: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(res.Body, 4096))
		return "", fmt.Errorf("discovery: %s answered %d", u, res.StatusCode)
	}
	var d discovery
	if err := json.NewDecoder(res.Body).Decode(&d); err != nil {
		return "", fmt.Errorf("discovery: %s: %w", u, err)
	}
	if d.Issuer != issuer {
		return "", fmt.Errorf("discovery: document issuer %q does not equal the configured issuer %q", truncate(d.Issuer, 200), issuer)
	}
	ju, err := url.Parse(d.JWKSURI)
	if err != nil || ju.Scheme != "https" || ju.Host == "" {
		return "", fmt.Errorf("discovery: jwks_uri %q is not an https URL", truncate(d.JWKSURI, 200))
	}
	return d.JWKSURI, nil
}

// drop cancels and forgets an issuer's key store (issuer changed or
// deleted on this replica; other replicas notice the revision or sweep).
func (k *keyStores) drop(issuerID string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ks := k.stores[issuerID]; ks != nil {
		ks.cancel()
		delete(k.stores, issuerID)
	}
}

// sweep cancels stores unused since before cutoff: issuers deleted on
// another replica, or no longer exchanged against.
func (k *keyStores) sweep(cutoff time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for id, ks := range k.stores {
		if ks.lastUsed.Load() < cutoff.UnixNano() {
			ks.cancel()
			delete(k.stores, id)
		}
	}
}

// closeAll cancels every store.
func (k *keyStores) closeAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for id, ks := range k.stores {
		ks.cancel()
		delete(k.stores, id)
	}
}
