// Package testutil holds what several test packages need alike: waiting
// for a condition, a clock the test moves, serving and calling a handler
// over h2c (HTTP/2 without TLS, as the gateway calls interns' daemons), a
// bearer credential on every request, and a buffer that goroutines may
// write to at once. Only tests import it.
package testutil

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// Eventually calls ok until it reports true, and fails t, naming what it
// waited for, when timeout passes first. Each call of ok should observe
// real state (a request, a file, a process): this is a wait for a
// condition, not a sleep standing in for one. The pause between calls
// grows from 1 ms to 100 ms, so a condition that holds soon is seen soon
// and a slow one is not polled hard.
func Eventually(t testing.TB, timeout time.Duration, what string, ok func() bool) {
	t.Helper()
	if !Poll(timeout, ok) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Poll is Eventually that reports whether ok held in time instead of
// failing, for a caller that says best what it last saw.
func Poll(timeout time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Millisecond)
	}
	return true
}

// Clock is a clock the test sets and moves, for code that takes its time
// from a func() time.Time (a Config.Now). Its methods are safe to call
// from any goroutine.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock standing at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now is the clock's time: pass c.Now where a func() time.Time is wanted.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set puts the clock at t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// ServeH2C serves h on a loopback port over HTTP/1.1 and h2c (HTTP/2 with
// prior knowledge), as `cohort intern` serves its daemon, until the test
// ends. A cleanup registered before the call runs after the server closed.
func ServeH2C(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// H2CTransport speaks only h2c with prior knowledge: every request is
// HTTP/2 over plain TCP, as the gateway calls a daemon.
func H2CTransport() *http.Transport {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Transport{Protocols: &p}
}

// H2CClient is a client on its own H2CTransport (so its own connections)
// that presents token as a bearer credential, or none when token is empty.
func H2CClient(token string) *http.Client {
	return &http.Client{Transport: Bearer(token, H2CTransport())}
}

// Bearer returns rt with "Authorization: Bearer token" set on every
// request (on a copy: the caller's request is not changed); an empty token
// sends no Authorization header.
func Bearer(token string, rt http.RoundTripper) http.RoundTripper {
	return bearer{token: token, rt: rt}
}

type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.token != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return b.rt.RoundTrip(r)
}

// SyncBuffer is a bytes.Buffer that goroutines may write to and read at
// once: a sink for a child process's output or a logger's.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
