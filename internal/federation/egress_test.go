package federation_test

import (
	"context"
	"crypto/x509"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
)

// productionClient is the client serve builds: no loopback, allow as
// --federation-allow-hosts says.
func productionClient(t testing.TB, p *idp, allow ...string) *http.Client {
	t.Helper()
	a, err := safehttp.ParseAllowlist(allow)
	if err != nil {
		t.Fatal(err)
	}
	return safehttp.New(safehttp.Options{Allow: a, ExtraRoots: []*x509.Certificate{p.srv.Certificate()}, Timeout: 2 * time.Second})
}

// issuerRow stores an issuer as one saved before the egress policy
// changed (or its host's DNS did): the save-time check cannot have seen it.
func issuerRow(t testing.TB, db *bun.DB, f *fed, issuerURL, jwksURL string) string {
	t.Helper()
	i := &store.FederationIssuer{ID: uuid.NewString(), OrganizationID: f.OrganizationID, Name: "saved earlier",
		IssuerURL: issuerURL, JWKSURL: jwksURL, Revision: 1, CreatedAt: time.Now()}
	if _, err := db.NewInsert().Model(i).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	return i.ID
}

// wantPolicyRefusal: a 400 that names the policy and the setting.
func wantPolicyRefusal(t testing.TB, what string, err error) {
	t.Helper()
	e := apierr.FromConnect(err)
	if err == nil || e.Status != http.StatusBadRequest || !strings.Contains(e.Message, "egress policy") ||
		!strings.Contains(e.Message, "--federation-allow-hosts") {
		t.Fatalf("%s: want 400 naming the egress policy and --federation-allow-hosts, got %v", what, err)
	}
}

// TestPolicyRefusedIssuerNotSaved: an issuer whose keys the egress policy
// would never let the service fetch is refused when saved, by the same
// check the dial applies (an allowlisted range passes).
func TestPolicyRefusedIssuerNotSaved(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newBareFed(t, db, p, func(s *server.Server) {
			s.Federation.Config.HTTPClient = productionClient(t, p, "10.0.0.0/8")
		})
		mk := f.ManagementKey
		for _, tc := range []struct{ name, issuer, jwks string }{
			{"issuer on loopback", p.URL, ""},
			{"issuer named localhost", "https://localhost:9", ""},
			{"issuer on a private address", "https://192.168.77.1", ""},
			{"JWKS on the metadata address", "https://idp.example.com", "https://169.254.169.254/jwks"},
			{"JWKS on loopback", "https://idp.example.com", p.URL + "/jwks"},
		} {
			_, err := try(f.client.CreateIssuer, mk, &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: tc.issuer, JwksUrl: tc.jwks})
			wantPolicyRefusal(t, tc.name, err)
		}
		if p.discoveryCalls.Load() != 0 {
			t.Fatal("the save-time check fetched from the issuer")
		}
		// An allowlisted range is saved; moving it to a refused address is
		// refused, and the issuer is unchanged.
		iss := call(t, f.client.CreateIssuer, mk, &cohortv1.CreateIssuerRequest{Name: "ok", IssuerUrl: "https://10.255.255.1"}).GetIssuer()
		_, err := try(f.client.UpdateIssuer, mk, &cohortv1.UpdateIssuerRequest{Id: iss.GetId(), IssuerUrl: ptr("https://127.0.0.1:8443")})
		wantPolicyRefusal(t, "update to loopback", err)
		got := call(t, f.client.GetIssuer, mk, &cohortv1.GetIssuerRequest{Id: iss.GetId()}).GetIssuer()
		if got.GetIssuerUrl() != "https://10.255.255.1" {
			t.Fatalf("refused update changed the issuer: %q", got.GetIssuerUrl())
		}
		// A name change alone is not second-guessed.
		call(t, f.client.UpdateIssuer, mk, &cohortv1.UpdateIssuerRequest{Id: iss.GetId(), Name: ptr("renamed")})
	})
}

// TestPolicyRefusedIssuerAtExchange: an issuer saved before the policy
// refused it (here: the in-process issuer on loopback, without the test
// override) fails the exchange as invalid_grant, not 503 "retry
// shortly", at dial time without reaching it, and the audit says the
// egress policy refused it and that it will not succeed.
func TestPolicyRefusedIssuerAtExchange(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newBareFed(t, db, p, func(s *server.Server) { s.Federation.Config.HTTPClient = productionClient(t, p) })
		f.usePolicyFor(t, issuerRow(t, db, f, p.URL, ""))
		for range 2 { // the second within the cooldown, from the remembered failure
			expectError(t, f.exchange(t, p.token(t, kidRSA, p.claims())), 400, "invalid_grant")
			r := lastAudit(t, f)
			if r.GetFailedCheck() != "issuer_keys" || !strings.Contains(r.GetDetail(), "egress policy") ||
				!strings.Contains(r.GetDetail(), "will not succeed") || !strings.Contains(r.GetDetail(), "loopback") {
				t.Fatalf("audit %q %q", r.GetFailedCheck(), r.GetDetail())
			}
		}
		if p.discoveryCalls.Load() != 0 {
			t.Fatal("the guarded client reached the loopback issuer")
		}
	})
}

func ptr[T any](v T) *T { return &v }
