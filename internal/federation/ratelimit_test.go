package federation_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestExchangeRateLimitMemory: past the per-address budget an exchange is
// 429 invalid_request with Retry-After, before any policy work (no audit).
func TestExchangeRateLimitMemory(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p, func(s *server.Server) {
			s.Federation.Config.Limiter, _ = ratelimit.NewMemory(ratelimit.Rate{Events: 3, Period: time.Minute, Burst: 3}, nil)
		})
		tok := p.token(t, kidRSA, p.claims())
		for range 3 {
			issued(t, f.exchange(t, tok))
		}
		a := f.exchange(t, tok)
		expectError(t, a, 429, "invalid_request")
		if n, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || n < 1 || n > 20 {
			t.Fatalf("Retry-After %q", a.header.Get("Retry-After"))
		}
		// Bad forms are refused before the limit and do not use it up;
		// everything past the limit is 429 whatever the policy.
		expectError(t, f.post(t, "grant_type=x"), 400, "unsupported_grant_type")
		expectError(t, f.post(t, exchangeForm(tok, "00000000-0000-0000-0000-000000000000")), 429, "invalid_request")
		f.Server.Federation.FlushAudit(context.Background())
		if n := count(t, db, "federation_exchanges"); n != 3 {
			t.Fatalf("%d audit rows, want 3: refused-by-rate requests must not reach the policy", n)
		}
	})
}

// TestExchangeRateLimitRedis runs two gateways (two replicas over one
// database) with the Redis limiter on the real Redis at 127.0.0.1:6379:
// they share one budget per address.
func TestExchangeRateLimitRedis(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		ctx := context.Background()
		rdb, err := ratelimit.OpenRedis(ctx, "redis://127.0.0.1:6379/0")
		if err != nil {
			t.Fatalf("Redis must run at 127.0.0.1:6379: %v", err)
		}
		t.Cleanup(func() { rdb.Close() })
		var b [6]byte
		rand.Read(b[:])
		prefix := "cohort-test:exchange:" + hex.EncodeToString(b[:]) + ":"
		limiter := func() ratelimit.Limiter {
			l, err := ratelimit.NewRedis(rdb, prefix, ratelimit.Rate{Events: 4, Period: time.Hour, Burst: 4})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		f := newFed(t, db, p, func(s *server.Server) { s.Federation.Config.Limiter = limiter() })
		// The second replica: its own server and federation service.
		srv2 := testenv.Server(t, db, f.Server.KEK)
		srv2.Federation.Config = settings(p)
		srv2.Federation.Config.Limiter = limiter()
		hs2 := httptest.NewServer(srv2.Handler())
		t.Cleanup(hs2.Close)
		post2 := func(body string) answer {
			res, err := hs2.Client().Post(hs2.URL+server.Prefix+"/oauth/token", "application/x-www-form-urlencoded", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			bb, _ := io.ReadAll(res.Body)
			return answer{res.StatusCode, string(bb), res.Header}
		}
		tok := p.token(t, kidRSA, p.claims())
		form := exchangeForm(tok, f.policyID)
		issued(t, f.post(t, form))
		issued(t, post2(form))
		issued(t, f.post(t, form))
		issued(t, post2(form))
		for _, a := range []answer{f.post(t, form), post2(form)} {
			expectError(t, a, 429, "invalid_request")
			if n, _ := strconv.Atoi(a.header.Get("Retry-After")); n < 800 || n > 900 {
				t.Fatalf("Retry-After %q, want about 900 s at 4 an hour", a.header.Get("Retry-After"))
			}
		}
		// The state is in Redis under the configured prefix.
		keys, err := rdb.Keys(ctx, "*"+prefix+"*").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("redis keys %v %v", keys, err)
		}
		if _, err := http.Get(hs2.URL + "/healthz"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestExchangeRateLimiterDown: when Redis is unreachable exchanges go on
// (a limiter outage must not stop every workload) and the log says so.
func TestExchangeRateLimiterDown(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p, func(s *server.Server) {
			rdb := redisDown()
			s.Federation.Config.Limiter, _ = ratelimit.NewRedis(rdb, "x:", ratelimit.PerMinute(1))
		})
		tok := p.token(t, kidRSA, p.claims())
		issued(t, f.exchange(t, tok))
		issued(t, f.exchange(t, tok))
		if !strings.Contains(f.Logs(), "rate limiter failed") {
			t.Fatal("limiter failure not logged")
		}
	})
}
