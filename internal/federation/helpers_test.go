package federation_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/golang-jwt/jwt/v5"
	"github.com/redis/go-redis/v9"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/federation"
	"github.com/cohort-dev/cohort/internal/keys"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// Test keys are generated once: RSA generation is slow.
var (
	keysOnce sync.Once
	rsaKey   *rsa.PrivateKey
	rsaKey2  *rsa.PrivateKey
	ecKey    *ecdsa.PrivateKey
	ecKey2   *ecdsa.PrivateKey
	p384Key  *ecdsa.PrivateKey
	edKey    ed25519.PrivateKey
)

func testKeys() {
	keysOnce.Do(func() {
		rsaKey, _ = rsa.GenerateKey(rand.Reader, 2048)
		rsaKey2, _ = rsa.GenerateKey(rand.Reader, 2048)
		ecKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		ecKey2, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		p384Key, _ = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		_, edKey, _ = ed25519.GenerateKey(rand.Reader)
	})
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func rsaJWK(kid string, k *rsa.PublicKey) map[string]any {
	return map[string]any{"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": b64(k.N.Bytes()), "e": b64(big.NewInt(int64(k.E)).Bytes())}
}

func ecJWK(kid string, k *ecdsa.PublicKey) map[string]any {
	raw, _ := k.Bytes()
	size := (len(raw) - 1) / 2
	crv := map[int]string{32: "P-256", 48: "P-384"}[size]
	return map[string]any{"kty": "EC", "kid": kid, "crv": crv, "x": b64(raw[1 : 1+size]), "y": b64(raw[1+size:])}
}

// idp is an identity provider in the test process: a real TLS server
// serving an OpenID discovery document and a JWKS.
type idp struct {
	srv *httptest.Server
	URL string

	mu             sync.Mutex
	jwks           []map[string]any
	discoveryIss   string // what discovery claims; "" = URL
	jwksStatus     int
	hang           bool
	jwksFetches    atomic.Int32
	discoveryCalls atomic.Int32
}

// The standard kids of the test IdP.
const (
	kidRSA = "rsa-1"
	kidEC  = "ec-1"
)

func newIDP(t testing.TB) *idp {
	t.Helper()
	testKeys()
	p := &idp{jwks: []map[string]any{rsaJWK(kidRSA, &rsaKey.PublicKey), ecJWK(kidEC, &ecKey.PublicKey)}}
	release := make(chan struct{})
	p.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch path := r.URL.Path; {
		case strings.HasSuffix(path, "/.well-known/openid-configuration"):
			// Any tenant path gets the root issuer's document, so a
			// tenant issuer URL meets a mismatching "issuer".
			p.discoveryCalls.Add(1)
			p.mu.Lock()
			iss := p.discoveryIss
			p.mu.Unlock()
			if iss == "" {
				iss = p.URL
			}
			json.NewEncoder(w).Encode(map[string]any{"issuer": iss, "jwks_uri": p.URL + "/jwks", "id_token_signing_alg_values_supported": []string{"RS256", "ES256"}})
		case path == "/jwks":
			p.jwksFetches.Add(1)
			p.mu.Lock()
			status, hang, set := p.jwksStatus, p.hang, append([]map[string]any(nil), p.jwks...)
			p.mu.Unlock()
			if hang {
				select {
				case <-r.Context().Done():
				case <-release:
				}
				return
			}
			if status != 0 {
				w.WriteHeader(status)
				return
			}
			json.NewEncoder(w).Encode(map[string]any{"keys": set})
		default:
			http.NotFound(w, r)
		}
	}))
	p.URL = p.srv.URL
	t.Cleanup(func() { close(release); p.srv.Close() })
	return p
}

func (p *idp) set(f func(p *idp)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// sign builds a compact JWS from raw header and payload JSON.
func sign(t testing.TB, header, payload string, key any) string {
	t.Helper()
	in := b64([]byte(header)) + "." + b64([]byte(payload))
	var alg struct {
		Alg string `json:"alg"`
	}
	json.Unmarshal([]byte(header), &alg)
	if key == nil {
		return in + "."
	}
	m := jwt.GetSigningMethod(alg.Alg)
	if m == nil {
		t.Fatalf("no signing method %q", alg.Alg)
	}
	sig, err := m.Sign(in, key)
	if err != nil {
		t.Fatal(err)
	}
	return in + "." + b64(sig)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// claims are the usual claims for the test IdP; change them per test.
func (p *idp) claims() map[string]any {
	now := time.Now().Unix()
	return map[string]any{"iss": p.URL, "sub": "repo:acme/app:ref:refs/heads/main", "aud": "cohort",
		"iat": now, "nbf": now - 5, "exp": now + 3600}
}

// token signs claims with the IdP's RSA key (RS256) unless kid says EC.
func (p *idp) token(t testing.TB, kid string, claims map[string]any) string {
	t.Helper()
	switch kid {
	case kidEC:
		return sign(t, mustJSON(map[string]any{"alg": "ES256", "kid": kid, "typ": "JWT"}), mustJSON(claims), ecKey)
	default:
		return sign(t, mustJSON(map[string]any{"alg": "RS256", "kid": kid, "typ": "JWT"}), mustJSON(claims), rsaKey)
	}
}

// fed is a gateway with federation set up against one IdP.
type fed struct {
	*testenv.Env
	idp      *idp
	client   cohortv1connect.FederationServiceClient
	issuerID string
	policyID string
	keyID    string // the bootstrap workspace key's id
}

// settings returns federation settings that trust the IdP's certificate
// and may reach loopback, with a limit tests do not meet.
func settings(p *idp) federation.Settings {
	lim, _ := ratelimit.NewMemory(ratelimit.PerMinute(1_000_000), nil)
	return federation.Settings{
		HTTPClient:   safehttp.New(safehttp.Options{AllowLoopback: true, ExtraRoots: []*x509.Certificate{p.srv.Certificate()}, Timeout: 2 * time.Second}),
		Limiter:      lim,
		FetchTimeout: time.Second,
		JWKSCooldown: 300 * time.Millisecond,
	}
}

// newFed starts a gateway over db with an issuer for p and one policy
// (subject = the default sub, audience "cohort") acting as the bootstrap
// workspace key.
func newFed(t testing.TB, db *bun.DB, p *idp, configure ...func(*server.Server)) *fed {
	t.Helper()
	f := newBareFed(t, db, p, configure...)
	iss := call(t, f.client.CreateIssuer, f.ManagementKey, &cohortv1.CreateIssuerRequest{Name: "test idp", IssuerUrl: p.URL})
	f.usePolicyFor(t, iss.GetIssuer().GetId())
	return f
}

// newBareFed is newFed without the issuer and policy.
func newBareFed(t testing.TB, db *bun.DB, p *idp, configure ...func(*server.Server)) *fed {
	t.Helper()
	cfg := append([]func(*server.Server){func(s *server.Server) { s.Federation.Config = settings(p) }}, configure...)
	e := testenv.New(t, db, cfg...)
	t.Cleanup(e.Server.Federation.Close)
	f := &fed{Env: e, idp: p, client: cohortv1connect.NewFederationServiceClient(e.HTTPClient(), e.URL)}
	f.keyID = keyID(t, db, e.WorkspaceKey)
	return f
}

// usePolicyFor makes issuerID f's issuer, with a policy as newFed's.
func (f *fed) usePolicyFor(t testing.TB, issuerID string) {
	t.Helper()
	e := f.Env
	f.issuerID = issuerID
	pol := call(t, f.client.CreatePolicy, e.ManagementKey, &cohortv1.CreatePolicyRequest{IssuerId: f.issuerID,
		Subject: "repo:acme/app:ref:refs/heads/main", Audience: "cohort", ApiKeyId: f.keyID})
	f.policyID = pol.GetPolicy().GetId()
}

func keyID(t testing.TB, db *bun.DB, key string) string {
	t.Helper()
	var k store.APIKey
	if err := db.NewSelect().Model(&k).Where("hash = ?", keys.Hash(key)).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	return k.ID
}

// call makes one Connect call with a bearer key and fails the test on error.
func call[Req, Res any](t testing.TB, fn func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error), key string, msg *Req) *Res {
	t.Helper()
	res, err := try(fn, key, msg)
	if err != nil {
		t.Fatalf("%T: %v", msg, err)
	}
	return res
}

// try makes one Connect call with a bearer key.
func try[Req, Res any](fn func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error), key string, msg *Req) (*Res, error) {
	req := connect.NewRequest(msg)
	if key != "" {
		req.Header().Set("Authorization", "Bearer "+key)
	}
	res, err := fn(context.Background(), req)
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// form encodes exchange parameters in order.
func form(kv ...string) string {
	var b strings.Builder
	for i := 0; i < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(url.QueryEscape(kv[i]) + "=" + url.QueryEscape(kv[i+1]))
	}
	return b.String()
}

// exchangeForm is the documented exchange body.
func exchangeForm(token, policyID string, extra ...string) string {
	return form(append([]string{"grant_type", federation.GrantTokenExchange, "subject_token_type", federation.TokenTypeJWT,
		"subject_token", token, "federation_policy_id", policyID}, extra...)...)
}

type answer struct {
	status int
	body   string
	header http.Header
}

func (f *fed) post(t testing.TB, body string) answer {
	t.Helper()
	status, b, h := f.Do(t, http.MethodPost, "/oauth/token", "", "application/x-www-form-urlencoded", body)
	return answer{status, b, h}
}

func (f *fed) exchange(t testing.TB, token string, extra ...string) answer {
	t.Helper()
	return f.post(t, exchangeForm(token, f.policyID, extra...))
}

// oauthErr decodes an RFC 6749 error body.
func oauthErr(t testing.TB, a answer) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(a.body), &e); err != nil {
		t.Fatalf("error body %q: %v", a.body, err)
	}
	return e.Error
}

// expectError checks an OAuth error answer: status, code, and the no-store
// headers every answer carries.
func expectError(t testing.TB, a answer, status int, code apierr.Reason) {
	t.Helper()
	if a.status != status || oauthErr(t, a) != string(code) {
		t.Fatalf("got %d %s, want %d %s", a.status, a.body, status, code)
	}
	noStore(t, a)
}

func noStore(t testing.TB, a answer) {
	t.Helper()
	if a.header.Get("Cache-Control") != "no-store" || a.header.Get("Pragma") != "no-cache" {
		t.Fatalf("answer %d lacks no-store headers: %v", a.status, a.header)
	}
}

// issued decodes a successful exchange answer.
func issued(t testing.TB, a answer) (token string, expiresIn int64) {
	t.Helper()
	if a.status != http.StatusOK {
		t.Fatalf("exchange: %d %s", a.status, a.body)
	}
	noStore(t, a)
	var m map[string]any
	if err := json.Unmarshal([]byte(a.body), &m); err != nil {
		t.Fatal(err)
	}
	if len(m) != 5 || m["issued_token_type"] != federation.TokenTypeAccessToken || m["token_type"] != "Bearer" || m["scope"] != "inference" {
		t.Fatalf("response fields: %v", m)
	}
	tok, _ := m["access_token"].(string)
	n, _ := m["expires_in"].(float64)
	if tok == "" || n != float64(int64(n)) {
		t.Fatalf("response fields: %v", m)
	}
	return tok, int64(n)
}

// auditRows lists the organization's exchange audit through the RPC.
func (f *fed) audit(t testing.TB) []*cohortv1.Exchange {
	t.Helper()
	return call(t, f.client.ListExchanges, f.ManagementKey, &cohortv1.ListExchangesRequest{PageSize: 200}).GetExchanges()
}

// count counts the rows of a table.
func count(t testing.TB, db *bun.DB, table string) int {
	t.Helper()
	n, err := db.NewSelect().TableExpr(table).Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// eachDB runs fn on SQLite and PostgreSQL with a fresh IdP.
func eachDB(t *testing.T, fn func(t *testing.T, db *bun.DB, p *idp)) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) { fn(t, db, newIDP(t)) })
}

var (
	_               = io.Discard
	_               = slog.Default
	_ crypto.Signer = edKey
)

// otherOrg is a second organization in the same database.
type otherOrg struct {
	orgID, managementKey, workspaceKeyID string
}

// newOtherOrg creates an organization with a management key and a
// workspace key.
func newOtherOrg(t testing.TB, f *fed, entitled bool) otherOrg {
	t.Helper()
	ctx := context.Background()
	acc := f.Server.Accounts
	org, err := acc.CreateOrganization(ctx, auth.Operator(""), &cohortv1.CreateOrganizationRequest{Name: "Other",
		Entitlements: &cohortv1.Entitlements{WorkloadIdentity: entitled}})
	if err != nil {
		t.Fatal(err)
	}
	op := auth.Operator(org.GetId())
	u, err := acc.CreateUser(ctx, op, &cohortv1.CreateUserRequest{Email: "admin@" + org.GetId() + ".test", Role: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	op.UserID = u.GetId()
	mk, err := acc.CreateAPIKey(ctx, op, &cohortv1.CreateApiKeyRequest{Kind: "management"})
	if err != nil {
		t.Fatal(err)
	}
	name := "Other WS"
	ws, err := f.Server.Workspaces.Create(ctx, op, &cohortv1.CreateWorkspaceRequest{Name: &name})
	if err != nil {
		t.Fatal(err)
	}
	wk, err := acc.CreateAPIKey(ctx, op, &cohortv1.CreateApiKeyRequest{Kind: "workspace", WorkspaceId: ws.GetId()})
	if err != nil {
		t.Fatal(err)
	}
	return otherOrg{orgID: org.GetId(), managementKey: mk.GetKey(), workspaceKeyID: wk.GetApiKey().GetId()}
}

// redisDown is a client to a port where nothing listens.
func redisDown() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
}
