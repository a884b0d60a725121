package federation_test

import (
	"crypto/ed25519"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

func lastAudit(t *testing.T, f *fed) *cohortv1.Exchange {
	t.Helper()
	rows := f.audit(t)
	if len(rows) == 0 {
		t.Fatal("no audit rows")
	}
	return rows[0]
}

// TestIssuerKeys: discovery, the JWKS cache, its refresh on unknown kids,
// and what happens when the identity provider cannot be reached. The
// refresh cooldown runs on the service's clock, which the test moves.
func TestIssuerKeys(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		clock := testutil.NewClock(time.Now())
		f := newFed(t, db, p, func(s *server.Server) { s.Federation.Now = clock.Now })
		cooldown := func() { clock.Add(settings(p).JWKSCooldown) }
		good := func() string { return p.token(t, kidRSA, p.claims()) }

		// Discovery once, then the JWKS once; later exchanges use the cache.
		for range 3 {
			issued(t, f.exchange(t, good()))
		}
		if d, j := p.discoveryCalls.Load(), p.jwksFetches.Load(); d != 1 || j != 1 {
			t.Fatalf("discovery %d, jwks %d fetches for three exchanges; want 1 and 1", d, j)
		}

		// The IdP publishes a new key. A token with its kid, inside the
		// cooldown after the first fetch, is refused without a fetch; after
		// the cooldown it causes one refresh and passes.
		p.set(func(p *idp) { p.jwks = append(p.jwks, rsaJWK("rsa-2", &rsaKey2.PublicKey)) })
		newKid := func() string {
			return sign(t, `{"alg":"RS256","kid":"rsa-2"}`, mustJSON(p.claims()), rsaKey2)
		}
		expectError(t, f.exchange(t, newKid()), 400, "invalid_grant")
		if j := p.jwksFetches.Load(); j != 1 {
			t.Fatalf("unknown kid inside the cooldown fetched the JWKS (%d fetches)", j)
		}
		cooldown()
		issued(t, f.exchange(t, newKid()))
		if j := p.jwksFetches.Load(); j != 2 {
			t.Fatalf("%d JWKS fetches after the cooldown, want 2", j)
		}

		// A burst of tokens with random kids: at most one fetch per
		// cooldown, and nobody waits for a limiter.
		cooldown()
		before := p.jwksFetches.Load()
		start := time.Now()
		var wg sync.WaitGroup
		codes := make([]string, 40)
		for i := range codes {
			wg.Go(func() {
				tok := sign(t, fmt.Sprintf(`{"alg":"RS256","kid":"random-%d"}`, i), mustJSON(p.claims()), rsaKey)
				a := f.exchange(t, tok)
				codes[i] = fmt.Sprint(a.status, oauthErr(t, a))
			})
		}
		wg.Wait()
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("40 random kids took %v", d)
		}
		if n := p.jwksFetches.Load() - before; n > 1 {
			t.Fatalf("%d JWKS fetches for a burst of random kids inside one cooldown, want at most 1", n)
		}
		for _, c := range codes {
			if c != "400invalid_grant" {
				t.Fatalf("random kid answered %s", c)
			}
		}

		// Changing the issuer replaces its key store (a new discovery).
		name := "renamed"
		call(t, f.client.UpdateIssuer, f.ManagementKey, &cohortv1.UpdateIssuerRequest{Id: f.issuerID, Name: &name})
		issued(t, f.exchange(t, good()))
		if d := p.discoveryCalls.Load(); d != 2 {
			t.Fatalf("discovery calls after an issuer change: %d, want 2", d)
		}

		// The JWKS fails: the cached keys keep working (no fetch needed);
		// an unknown kid then triggers a refresh that fails: 503.
		p.set(func(p *idp) { p.jwksStatus = http.StatusInternalServerError })
		issued(t, f.exchange(t, good()))
		cooldown()
		expectError(t, f.exchange(t, sign(t, `{"alg":"RS256","kid":"rsa-3"}`, mustJSON(p.claims()), rsaKey)), 503, "temporarily_unavailable")
		if r := lastAudit(t, f); r.GetFailedCheck() != "signature" || !strings.Contains(r.GetDetail(), "500") {
			t.Fatalf("audit %v", r)
		}
		// Within the cooldown another unknown kid is told the same (the
		// last refresh failed), without a fetch.
		n := p.jwksFetches.Load()
		expectError(t, f.exchange(t, sign(t, `{"alg":"RS256","kid":"rsa-4"}`, mustJSON(p.claims()), rsaKey)), 503, "temporarily_unavailable")
		if p.jwksFetches.Load() != n {
			t.Fatal("fetched inside the cooldown")
		}
		p.set(func(p *idp) { p.jwksStatus = 0 })

		// Deleting the issuer stops exchanges at once.
		call(t, f.client.DeleteIssuer, f.ManagementKey, &cohortv1.DeleteIssuerRequest{Id: f.issuerID})
		expectError(t, f.exchange(t, good()), 400, "invalid_grant")
	})
}

// TestIssuerUnreachable: every way the identity provider can fail to give
// its keys answers 503 temporarily_unavailable, fast, and the audit says
// why. A failure is remembered for the cooldown, not fetched again. The
// cooldown runs on the service's clock, which the test moves.
func TestIssuerUnreachable(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		clock := testutil.NewClock(time.Now())
		f := newFed(t, db, p, func(s *server.Server) { s.Federation.Now = clock.Now })
		mk := f.ManagementKey
		newPolicy := func(issuerURL, jwksURL string) string {
			iss := call(t, f.client.CreateIssuer, mk, &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: issuerURL, JwksUrl: jwksURL}).GetIssuer().GetId()
			return call(t, f.client.CreatePolicy, mk, &cohortv1.CreatePolicyRequest{IssuerId: iss, Subject: "s", Audience: "cohort", ApiKeyId: f.keyID}).GetPolicy().GetId()
		}
		tokenFor := func(iss string) string {
			c := p.claims()
			c["iss"], c["sub"] = iss, "s"
			return p.token(t, kidRSA, c)
		}
		policies := map[string]string{} // test case → its policy
		for _, tc := range []struct {
			name, issuer, jwks, detail string
			setup                      func()
		}{
			{"discovery names another issuer", p.URL + "/tenant", "", "does not equal", nil},
			{"JWKS answers 500", p.URL + "/five", p.URL + "/jwks", "500", func() { p.set(func(p *idp) { p.jwksStatus = 500 }) }},
			{"JWKS hangs", p.URL + "/hang", p.URL + "/jwks", "deadline", func() { p.set(func(p *idp) { p.jwksStatus, p.hang = 0, true }) }},
		} {
			if tc.setup != nil {
				tc.setup()
			}
			pol := newPolicy(tc.issuer, tc.jwks)
			policies[tc.name] = pol
			start := time.Now()
			a := f.post(t, exchangeForm(tokenFor(tc.issuer), pol))
			expectError(t, a, 503, "temporarily_unavailable")
			if d := time.Since(start); d > 2500*time.Millisecond {
				t.Errorf("%s: answered after %v", tc.name, d)
			}
			if r := lastAudit(t, f); r.GetFailedCheck() != "issuer_keys" || !strings.Contains(r.GetDetail(), tc.detail) {
				t.Errorf("%s: audit %q %q", tc.name, r.GetFailedCheck(), r.GetDetail())
			}
			// Remembered: the second try inside the cooldown is 503 at once.
			fetches := p.jwksFetches.Load()
			start = time.Now()
			expectError(t, f.post(t, exchangeForm(tokenFor(tc.issuer), pol)), 503, "temporarily_unavailable")
			if d := time.Since(start); d > 200*time.Millisecond || p.jwksFetches.Load() != fetches {
				t.Errorf("%s: second try took %v and fetched %d times", tc.name, d, p.jwksFetches.Load()-fetches)
			}
		}
		// After the IdP's recovery, a failure is still remembered until the
		// cooldown has passed; then the same issuers work, as does a new one.
		p.set(func(p *idp) { p.jwksStatus, p.hang = 0, false })
		recovered := []struct{ name, issuer string }{{"JWKS answers 500", p.URL + "/five"}, {"JWKS hangs", p.URL + "/hang"}}
		for _, r := range recovered {
			expectError(t, f.post(t, exchangeForm(tokenFor(r.issuer), policies[r.name])), 503, "temporarily_unavailable")
		}
		clock.Add(settings(p).JWKSCooldown)
		for _, r := range recovered {
			a := f.post(t, exchangeForm(tokenFor(r.issuer), policies[r.name]))
			if a.status != http.StatusOK {
				t.Fatalf("%s, recovered, after the cooldown: %d %s", r.name, a.status, a.body)
			}
			issued(t, a)
		}
		pol := newPolicy(p.URL+"/recovered", p.URL+"/jwks")
		issued(t, f.post(t, exchangeForm(tokenFor(p.URL+"/recovered"), pol)))
	})
}

// TestJWKSWithForeignKeys: a JWKS that also holds key types we do not use
// (symmetric, Ed25519, P-384, an unknown kty) still serves the RSA and EC
// keys we do.
func TestJWKSWithForeignKeys(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		p.set(func(p *idp) {
			p.jwks = append([]map[string]any{
				{"kty": "oct", "kid": "hmac", "k": b64([]byte("0123456789abcdef0123456789abcdef"))},
				{"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": b64(edKey.Public().(ed25519.PublicKey))},
				ecJWK("p384", &p384Key.PublicKey),
				{"kty": "AKP", "kid": "pq", "alg": "ML-DSA-44", "pub": b64([]byte("post-quantum"))},
				{"kty": "RSA", "kid": "enc", "use": "enc", "n": b64(rsaKey2.N.Bytes()), "e": "AQAB"},
			}, p.jwks...)
		})
		f := newFed(t, db, p)
		issued(t, f.exchange(t, p.token(t, kidRSA, p.claims())))
		issued(t, f.exchange(t, p.token(t, kidEC, p.claims())))
		// The foreign keys themselves verify nothing.
		for _, tok := range []string{
			sign(t, `{"alg":"HS256","kid":"hmac"}`, mustJSON(p.claims()), []byte("0123456789abcdef0123456789abcdef")),
			sign(t, `{"alg":"ES256","kid":"p384"}`, mustJSON(p.claims()), ecKey),
			sign(t, `{"alg":"RS256","kid":"ed"}`, mustJSON(p.claims()), rsaKey),
			sign(t, `{"alg":"RS256","kid":"enc"}`, mustJSON(p.claims()), rsaKey2),
		} {
			expectError(t, f.exchange(t, tok), 400, "invalid_grant")
		}
	})
}
