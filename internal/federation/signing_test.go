package federation_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/federation"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func kidOf(t *testing.T, tok string) string {
	t.Helper()
	parsed, _, err := jwt.NewParser().ParseUnverified(tok, jwt.MapClaims{})
	if err != nil {
		t.Fatal(err)
	}
	return parsed.Header["kid"].(string)
}

// TestSigningKeyRotation: keys rotate on schedule; the next key is
// published before it signs; a key stays published until every token it
// signed has expired; replicas find keys other replicas created.
func TestSigningKeyRotation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		t0 := time.Now().UTC().Truncate(time.Second)
		clock := &fakeClock{t: t0}
		f := newFed(t, db, p, func(s *server.Server) { s.Federation.Now = clock.now })
		ctx := context.Background()
		exchangeAt := func(at time.Time) string {
			clock.set(at)
			c := p.claims()
			c["iat"], c["nbf"], c["exp"] = at.Unix(), at.Unix()-5, at.Unix()+3600
			tok, _ := issued(t, f.exchange(t, p.token(t, kidRSA, c)))
			return tok
		}
		published := func(at time.Time) []string {
			clock.set(at)
			status, body, h := f.Do(t, http.MethodGet, "/oauth/jwks", "", "", "")
			if status != 200 || h.Get("Cache-Control") != "public, max-age=300" {
				t.Fatalf("jwks %d %v", status, h)
			}
			var set struct {
				Keys []map[string]string `json:"keys"`
			}
			json.Unmarshal([]byte(body), &set)
			var kids []string
			for _, k := range set.Keys {
				if k["kty"] != "EC" || k["crv"] != "P-256" || k["alg"] != "ES256" || k["use"] != "sig" || len(k["x"]) != 43 || len(k["y"]) != 43 || k["d"] != "" {
					t.Fatalf("published key %v", k)
				}
				kids = append(kids, k["kid"])
			}
			return kids
		}

		tokA := exchangeAt(t0)
		a := kidOf(t, tokA)
		if got := published(t0); len(got) != 1 || got[0] != a {
			t.Fatalf("at start: %v", got)
		}
		// Not yet: 2 h before the end is when the next key appears.
		if got := published(t0.Add(21*time.Hour + 59*time.Minute)); len(got) != 1 {
			t.Fatalf("before pre-publication: %v", got)
		}
		got := published(t0.Add(22 * time.Hour))
		if len(got) != 2 || got[0] != a {
			t.Fatalf("pre-published: %v", got)
		}
		b := got[1]
		// Still signed by A until A's period ends.
		late := exchangeAt(t0.Add(23*time.Hour + 55*time.Minute))
		if kidOf(t, late) != a {
			t.Fatal("the pre-published key signed early")
		}
		tokB := exchangeAt(t0.Add(24 * time.Hour))
		if kidOf(t, tokB) != b {
			t.Fatalf("after the rotation signed by %s, want %s", kidOf(t, tokB), b)
		}
		// A token A signed at the end still verifies after the rotation.
		clock.set(t0.Add(24*time.Hour + 5*time.Minute))
		if _, err := f.Server.Federation.VerifyAccessToken(ctx, late); err != nil {
			t.Fatalf("token of the previous key: %v", err)
		}
		if got := published(t0.Add(24*time.Hour + 10*time.Minute)); len(got) != 2 {
			t.Fatalf("overlap: %v", got)
		}
		// Once every token of A has expired, A is no longer published.
		if got := published(t0.Add(24*time.Hour + 17*time.Minute)); len(got) != 1 || got[0] != b {
			t.Fatalf("after A retired: %v", got)
		}
		if _, err := f.Server.Federation.VerifyAccessToken(ctx, late); err == nil {
			t.Fatal("expired token of a retired key accepted")
		}

		// Another replica (its own service over the same database) knows B
		// from the database when it meets its kid.
		other := federation.New(db, f.Server.KEK, nil)
		other.Now = clock.now
		clock.set(t0.Add(24*time.Hour + 1*time.Minute))
		if id, err := other.VerifyAccessToken(ctx, tokB); err != nil || id != f.keyID {
			t.Fatalf("other replica: %q %v", id, err)
		}

		// Down past the end of every key: the next exchange makes a key
		// that signs at once.
		tokC := exchangeAt(t0.Add(30 * 24 * time.Hour))
		if kidOf(t, tokC) == a || kidOf(t, tokC) == b {
			t.Fatal("an expired key signed")
		}

		// Private keys are stored wrapped by the KEK and bound to their
		// row: they open with their own kid only.
		var rows []store.SigningKey
		if err := db.NewSelect().Model(&rows).Order("generation").Scan(ctx); err != nil {
			t.Fatal(err)
		}
		if len(rows) != 3 {
			t.Fatalf("%d signing keys", len(rows))
		}
		for i, r := range rows {
			w, _ := base64.StdEncoding.DecodeString(r.PrivateKeyWrapped)
			if _, err := f.Server.KEK.Unwrap(w, []byte("cohort/signing-key/"+r.ID)); err != nil {
				t.Fatalf("key %d does not unwrap: %v", i, err)
			}
			if _, err := f.Server.KEK.Unwrap(w, []byte("cohort/signing-key/"+rows[(i+1)%3].ID)); err == nil {
				t.Fatal("a wrapped key opened for another row")
			}
			if strings.Contains(f.Logs(), r.PrivateKeyWrapped[:40]) {
				t.Fatal("key material in the log")
			}
		}

		// Maintenance a day later deletes the retired keys and the audit
		// rows past the 30 days of retention, and keeps the rest.
		clock.set(t0.Add(31 * 24 * time.Hour))
		f.Server.Federation.Maintain(ctx)
		var left []store.SigningKey
		db.NewSelect().Model(&left).Scan(ctx)
		// A and B are gone; C remains, with the key that succeeds it.
		if len(left) != 2 || left[0].ID == rows[0].ID || left[0].ID == rows[1].ID || left[1].ID == rows[0].ID || left[1].ID == rows[1].ID {
			t.Fatalf("signing keys after maintenance: %d", len(left))
		}
		// Cut-off t0 + 1 day: the exchanges at t0 and t0 + 23h55 go; those
		// at t0 + 24h and t0 + 30 days stay.
		if audit := f.audit(t); len(audit) != 2 {
			t.Fatalf("audit rows after retention: %d", len(audit))
		}
	})
}
