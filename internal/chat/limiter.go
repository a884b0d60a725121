package chat

import (
	"context"
	"sync"
	"time"
)

// Default turn rate (docs/decisions.md): a burst of 60 turns, refilled at
// 60 per minute, per user or organization.
const (
	DefaultTurnBurst  = 60
	DefaultTurnPeriod = time.Minute
)

// MemoryLimiter is a token bucket per key, in this process's memory. With
// several gateway replicas each has its own buckets; a shared (Redis)
// Limiter replaces it there.
type MemoryLimiter struct {
	// Burst is the bucket size; Period the time to refill it completely.
	Burst  int
	Period time.Duration
	// Now is the clock; nil uses time.Now.
	Now func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
	swept   time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

// NewMemoryLimiter returns a limiter allowing burst turns per period.
func NewMemoryLimiter(burst int, period time.Duration) *MemoryLimiter {
	return &MemoryLimiter{Burst: burst, Period: period}
}

// Allow takes one token from key's bucket if it has one.
func (l *MemoryLimiter) Allow(_ context.Context, key string) (bool, error) {
	now := time.Now()
	if l.Now != nil {
		now = l.Now()
	}
	rate := float64(l.Burst) / l.Period.Seconds() // tokens per second
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = map[string]*bucket{}
	}
	// Full buckets carry no information: drop them now and then so the map
	// stays as small as the set of recently active callers.
	if now.Sub(l.swept) > l.Period {
		for k, b := range l.buckets {
			if b.tokens+now.Sub(b.at).Seconds()*rate >= float64(l.Burst) {
				delete(l.buckets, k)
			}
		}
		l.swept = now
	}
	b, ok := l.buckets[key]
	if !ok {
		b = &bucket{tokens: float64(l.Burst), at: now}
		l.buckets[key] = b
	}
	b.tokens = min(float64(l.Burst), b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	if b.tokens < 1 {
		return false, nil
	}
	b.tokens--
	return true, nil
}
