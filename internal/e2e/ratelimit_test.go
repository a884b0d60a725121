package e2e_test

import (
	"context"
	"testing"

	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

const redisURL = "redis://127.0.0.1:6379/0"

// turns runs n turns through gateways in turn and checks the statuses.
func turns(t *testing.T, c *cluster, intern string, gws []*proc, want ...int) {
	t.Helper()
	for i, status := range want {
		res := chat(t, gws[i%len(gws)], c.WK, intern, user("count me"))
		if status == 429 {
			refusal(t, res, 429, "rate_limited")
			continue
		}
		if s := readAll(t, res); s.Finish != "stop" {
			t.Fatalf("turn %d: %q", i, s.Finish)
		}
	}
}

// --turn-rate in memory: each replica counts its own turns; a tool reply
// continues an admitted turn and is never refused.
func TestTurnRateMemory(t *testing.T) {
	c, a := newCluster(t, storetest.PostgresURL(t), "--turn-rate", "2/h")
	b := c.Gateway(t, "--no-bootstrap", "--turn-rate", "2/h")
	d := c.Daemon(t, c.Demo, nil)
	p := readAll(t, chat(t, a, c.WK, d.id, user("$ echo past the limit", `"approval_mode":"manual"`)))
	turns(t, c, d.id, []*proc{a}, 200, 429)
	if s := readAll(t, chat(t, a, c.WK, d.id, p.answer("allow_once"))); s.Finish != "stop" {
		t.Fatalf("reply past the limit: %q", s.Finish)
	}
	// B has its own memory: two turns there, then B refuses too.
	turns(t, c, d.id, []*proc{b}, 200, 200, 429)
}

// --redis-url: two replicas share one turn budget.
func TestTurnRateRedis(t *testing.T) {
	rdb, err := ratelimit.OpenRedis(context.Background(), redisURL)
	if err != nil {
		t.Skipf("!!! SKIPPING: Redis unreachable at %s: %v", redisURL, err)
	}
	rdb.Close()
	c, a := newCluster(t, storetest.PostgresURL(t), "--turn-rate", "3/h", "--redis-url", redisURL)
	b := c.Gateway(t, "--no-bootstrap", "--turn-rate", "3/h", "--redis-url", redisURL)
	d := c.Daemon(t, c.Demo, nil)
	// A, B, A: the shared budget of 3 is spent; then both refuse.
	turns(t, c, d.id, []*proc{a, b}, 200, 200, 200, 429, 429)
}
