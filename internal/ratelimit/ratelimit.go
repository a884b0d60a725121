// Package ratelimit limits how often a key (a source address, a user, an
// organization) may do something. Two implementations share one algorithm,
// GCRA (the generic cell rate algorithm, a token bucket kept as a single
// timestamp per key): Memory for one process, and Redis so that replicas
// behind a load balancer share their counts. The caller chooses what a
// limiter failure (Redis down) means for its route.
package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Limiter decides whether one more event is allowed for key.
type Limiter interface {
	// Allow consumes one event for key. When it is refused, retryAfter says
	// how long until one would be allowed. err is set only when the limiter
	// itself failed (ok is then meaningless).
	Allow(ctx context.Context, key string) (ok bool, retryAfter time.Duration, err error)
}

// Rate is Events per Period, with bursts of up to Burst events.
type Rate struct {
	Events int
	Period time.Duration
	Burst  int
}

// PerMinute is n events a minute with bursts of n.
func PerMinute(n int) Rate { return Rate{Events: n, Period: time.Minute, Burst: n} }

// Validate reports whether r can be used.
func (r Rate) Validate() error {
	if r.Events <= 0 || r.Period <= 0 || r.Burst <= 0 {
		return fmt.Errorf("rate limit %s: events, period and burst must be positive", r)
	}
	return nil
}

// interval is the time one event costs.
func (r Rate) interval() time.Duration { return r.Period / time.Duration(r.Events) }

// String renders r as "events/period burst N".
func (r Rate) String() string {
	return fmt.Sprintf("%d/%s burst %d", r.Events, r.Period, r.Burst)
}

// Spec renders r as ParseRate reads it ("60/m", "5/s,burst=10"): the
// flags show their default so.
func (r Rate) Spec() string {
	unit := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[r.Period]
	s := fmt.Sprintf("%d/%s", r.Events, unit)
	if r.Burst != r.Events {
		s += fmt.Sprintf(",burst=%d", r.Burst)
	}
	return s
}

// ParseRate reads "N/s", "N/m" or "N/h", optionally followed by ",burst=B"
// (burst defaults to N), as the command line takes it.
func ParseRate(s string) (Rate, error) {
	spec, burstPart, hasBurst := strings.Cut(strings.TrimSpace(s), ",")
	n, unit, ok := strings.Cut(spec, "/")
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: want N/s, N/m or N/h[,burst=B]", s)
	}
	events, err := strconv.Atoi(n)
	if err != nil {
		return Rate{}, fmt.Errorf("rate %q: %q is not a number", s, n)
	}
	r := Rate{Events: events, Burst: events}
	switch unit {
	case "s":
		r.Period = time.Second
	case "m":
		r.Period = time.Minute
	case "h":
		r.Period = time.Hour
	default:
		return Rate{}, fmt.Errorf("rate %q: unit must be s, m or h", s)
	}
	if hasBurst {
		b, ok := strings.CutPrefix(burstPart, "burst=")
		if !ok {
			return Rate{}, fmt.Errorf("rate %q: want ,burst=B after the rate", s)
		}
		if r.Burst, err = strconv.Atoi(b); err != nil {
			return Rate{}, fmt.Errorf("rate %q: burst %q is not a number", s, b)
		}
	}
	return r, r.Validate()
}

// Memory is an in-process limiter. Keys whose bucket has refilled are
// forgotten, so memory follows the number of recently active keys.
type Memory struct {
	rate Rate
	now  func() time.Time

	mu        sync.Mutex
	tat       map[string]time.Time // theoretical arrival time per key
	lastSweep time.Time
}

// NewMemory returns an in-process limiter for rate. now may be nil (the
// wall clock); tests pass a fake clock.
func NewMemory(rate Rate, now func() time.Time) (*Memory, error) {
	if err := rate.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &Memory{rate: rate, now: now, tat: map[string]time.Time{}}, nil
}

// Allow implements Limiter with GCRA: each event pushes the key's
// theoretical arrival time one interval later; an event is allowed while
// that time is at most a burst's worth of intervals ahead of now.
func (m *Memory) Allow(_ context.Context, key string) (bool, time.Duration, error) {
	now := m.now()
	interval := m.rate.interval()
	tolerance := interval * time.Duration(m.rate.Burst)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweep(now)
	tat, ok := m.tat[key]
	if !ok || tat.Before(now) {
		tat = now
	}
	next := tat.Add(interval)
	if allowAt := next.Add(-tolerance); allowAt.After(now) {
		return false, allowAt.Sub(now), nil
	}
	m.tat[key] = next
	return true, 0, nil
}

// sweep drops keys whose bucket is full again, at most once a period.
func (m *Memory) sweep(now time.Time) {
	if now.Sub(m.lastSweep) < m.rate.Period {
		return
	}
	m.lastSweep = now
	for k, tat := range m.tat {
		if !tat.After(now) {
			delete(m.tat, k)
		}
	}
}

// Redis is a limiter whose state lives in Redis (redis_rate's GCRA), shared
// by every replica using the same server and prefix.
type Redis struct {
	rate   Rate
	prefix string
	l      *redis_rate.Limiter
}

// NewRedis returns a Redis-backed limiter. prefix namespaces the keys (one
// per use, e.g. "cohort:exchange:").
func NewRedis(client redis.UniversalClient, prefix string, rate Rate) (*Redis, error) {
	if err := rate.Validate(); err != nil {
		return nil, err
	}
	return &Redis{rate: rate, prefix: prefix, l: redis_rate.NewLimiter(client)}, nil
}

// Allow implements Limiter.
func (r *Redis) Allow(ctx context.Context, key string) (bool, time.Duration, error) {
	res, err := r.l.Allow(ctx, r.prefix+key, redis_rate.Limit{Rate: r.rate.Events, Period: r.rate.Period, Burst: r.rate.Burst})
	if err != nil {
		return false, 0, fmt.Errorf("rate limiter: %w", err)
	}
	if res.Allowed > 0 {
		return true, 0, nil
	}
	retry := res.RetryAfter
	if retry < 0 {
		retry = 0
	}
	return false, retry, nil
}

// OpenRedis connects to a redis:// or rediss:// URL and checks the server
// answers.
func OpenRedis(ctx context.Context, url string) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	c := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis at %s: %w", opt.Addr, err)
	}
	return c, nil
}
