package federation_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// BenchmarkFederation measures, in one run, a full token exchange through
// the real HTTP handler with a warm JWKS cache (on SQLite with one
// connection, on SQLite with its read pool as serve opens it, and on
// PostgreSQL), and the bare cryptography every exchange must do (verify an
// RS256 subject token, sign an ES256 access token): the floor the exchange
// cannot go below.
//
//	go test -run '^$' -bench BenchmarkFederation -count 10 ./internal/federation/
func BenchmarkFederation(b *testing.B) {
	for _, store := range []string{"one_connection", "read_pool", "postgres"} {
		b.Run(store, func(b *testing.B) { benchFederation(b, store) })
	}
}

func benchFederation(b *testing.B, store string) {
	p := newIDP(b)
	db, reads := storetest.SQLiteWithReads(b)
	if store == "postgres" {
		db, reads = storetest.Postgres(b), nil
	}
	readPool := store == "read_pool"
	f := newFed(b, db, p)
	// A gateway as `cohort serve` builds it, logging to nowhere (the test
	// environment keeps every log line in memory).
	srv := testenv.Server(b, f.DB, f.Server.KEK)
	srv.Federation.Config = settings(p)
	if readPool {
		srv.Federation.Reads = reads
	}
	h := srv.Handler()
	body := exchangeForm(p.token(b, kidRSA, p.claims()), f.policyID)
	exchange := func() int {
		req, _ := http.NewRequest(http.MethodPost, server.Prefix+"/oauth/token", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = "203.0.113.7:41000"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := exchange(); code != http.StatusOK { // warms the JWKS cache and the signing key
		b.Fatalf("warm-up exchange: %d", code)
	}

	b.Run("exchange", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if code := exchange(); code != http.StatusOK {
				b.Fatalf("exchange: %d", code)
			}
		}
	})

	// Eight clients at once on two cores: with one SQLite connection for
	// everything, the policy reads queue behind each other; PostgreSQL
	// overlaps round trips.
	b.Run("exchange_8_clients", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if code := exchange(); code != http.StatusOK {
					b.Errorf("exchange: %d", code)
					return
				}
			}
		})
	})

	b.Run("crypto_floor", func(b *testing.B) {
		tok := p.token(b, kidRSA, p.claims())
		i := strings.LastIndex(tok, ".")
		input := tok[:i]
		sig, _ := jwt.NewParser().DecodeSegment(tok[i+1:])
		claims := `{"aud":["cohort"],"client_id":"k","exp":1900000000,"federation_issuer_id":"i","federation_policy_id":"p","iat":1899999100,"iss":"cohort","jti":"j","scope":"inference","sub":"repo:acme/app:ref:refs/heads/main"}`
		signing := b64([]byte(`{"alg":"ES256","kid":"k","typ":"at+jwt"}`)) + "." + b64([]byte(claims))
		b.ReportAllocs()
		for b.Loop() {
			if err := jwt.SigningMethodRS256.Verify(input, sig, &rsaKey.PublicKey); err != nil {
				b.Fatal(err)
			}
			if _, err := jwt.SigningMethodES256.Sign(signing, ecKey); err != nil {
				b.Fatal(err)
			}
		}
	})
}
