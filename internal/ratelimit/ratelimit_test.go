package ratelimit_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

func TestMemoryBurstThenRefill(t *testing.T) {
	t.Parallel()
	c := testutil.NewClock(time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC))
	// 6 a minute = one every 10 s, bursts of 3.
	l, err := ratelimit.NewMemory(ratelimit.Rate{Events: 6, Period: time.Minute, Burst: 3}, c.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 3 {
		if ok, _, _ := l.Allow(ctx, "a"); !ok {
			t.Fatalf("event %d of the burst refused", i+1)
		}
	}
	ok, retry, err := l.Allow(ctx, "a")
	if ok || err != nil || retry != 10*time.Second {
		t.Fatalf("4th event: ok=%v retry=%v err=%v, want refused with retry 10s", ok, retry, err)
	}
	// Another key has its own bucket.
	if ok, _, _ := l.Allow(ctx, "b"); !ok {
		t.Fatal("key b refused")
	}
	c.Add(9 * time.Second)
	if ok, retry, _ := l.Allow(ctx, "a"); ok || retry != time.Second {
		t.Fatalf("after 9s: ok=%v retry=%v, want refused with 1s", ok, retry)
	}
	c.Add(time.Second)
	if ok, _, _ := l.Allow(ctx, "a"); !ok {
		t.Fatal("after 10s: refused, want one event allowed")
	}
	if ok, _, _ := l.Allow(ctx, "a"); ok {
		t.Fatal("second event after 10s allowed")
	}
	// A long pause refills the burst, and no more.
	c.Add(time.Hour)
	for i := range 3 {
		if ok, _, _ := l.Allow(ctx, "a"); !ok {
			t.Fatalf("refilled burst event %d refused", i+1)
		}
	}
	if ok, _, _ := l.Allow(ctx, "a"); ok {
		t.Fatal("burst grew past 3 after a long pause")
	}
}

func TestParseRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want ratelimit.Rate
		ok   bool
	}{
		{"60/m", ratelimit.Rate{Events: 60, Period: time.Minute, Burst: 60}, true},
		{"5/s,burst=10", ratelimit.Rate{Events: 5, Period: time.Second, Burst: 10}, true},
		{"100/h", ratelimit.Rate{Events: 100, Period: time.Hour, Burst: 100}, true},
		{"0/m", ratelimit.Rate{}, false},
		{"5/d", ratelimit.Rate{}, false},
		{"x/m", ratelimit.Rate{}, false},
		{"5/m,b=1", ratelimit.Rate{}, false},
		{"5", ratelimit.Rate{}, false},
		{"5/m,burst=0", ratelimit.Rate{}, false},
	} {
		got, err := ratelimit.ParseRate(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseRate(%q) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok && got.Spec() != tc.in {
			t.Errorf("ParseRate(%q).Spec() = %q", tc.in, got.Spec())
		}
	}
}

func redisURL() string { return "redis://127.0.0.1:6379/0" }

func prefix(t *testing.T) string {
	var b [6]byte
	rand.Read(b[:])
	return "cohort-test:" + t.Name() + ":" + hex.EncodeToString(b[:]) + ":"
}

// TestRedisSharedAcrossReplicas runs two limiters (two replicas) on the real
// Redis: they share one budget per key.
func TestRedisSharedAcrossReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c1, err := ratelimit.OpenRedis(ctx, redisURL())
	if err != nil {
		t.Fatalf("Redis must run at 127.0.0.1:6379 for this test: %v", err)
	}
	defer c1.Close()
	c2, err := ratelimit.OpenRedis(ctx, redisURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	p := prefix(t)
	rate := ratelimit.Rate{Events: 4, Period: time.Hour, Burst: 4}
	a, err := ratelimit.NewRedis(c1, p, rate)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ratelimit.NewRedis(c2, p, rate)
	for i, l := range []ratelimit.Limiter{a, b, a, b} {
		if ok, _, err := l.Allow(ctx, "203.0.113.9"); !ok || err != nil {
			t.Fatalf("event %d: ok=%v err=%v", i+1, ok, err)
		}
	}
	for _, l := range []ratelimit.Limiter{a, b} {
		ok, retry, err := l.Allow(ctx, "203.0.113.9")
		if ok || err != nil {
			t.Fatalf("5th event on a shared budget: ok=%v err=%v", ok, err)
		}
		// One event costs 15 minutes at 4 an hour.
		if retry <= 14*time.Minute || retry > 15*time.Minute {
			t.Fatalf("retry after %v, want about 15m", retry)
		}
	}
	if ok, _, _ := a.Allow(ctx, "198.51.100.1"); !ok {
		t.Fatal("another key refused")
	}
	// A limiter with another prefix has its own budget.
	other, _ := ratelimit.NewRedis(c1, prefix(t), rate)
	if ok, _, _ := other.Allow(ctx, "203.0.113.9"); !ok {
		t.Fatal("another prefix refused")
	}
}

func TestRedisDownIsAnError(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	l, err := ratelimit.NewRedis(c, prefix(t), ratelimit.PerMinute(10))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Allow(context.Background(), "k"); err == nil {
		t.Fatal("no error from an unreachable Redis")
	}
	if _, err := ratelimit.OpenRedis(context.Background(), "redis://127.0.0.1:1/0"); err == nil {
		t.Fatal("OpenRedis succeeded against nothing")
	}
	if _, err := ratelimit.OpenRedis(context.Background(), "http://x"); err == nil {
		t.Fatal("OpenRedis accepted an http URL")
	}
}

func TestInvalidRateRefused(t *testing.T) {
	t.Parallel()
	if _, err := ratelimit.NewMemory(ratelimit.Rate{}, nil); err == nil {
		t.Fatal("zero rate accepted")
	}
}
