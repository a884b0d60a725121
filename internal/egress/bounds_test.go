package egress_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/relayctx"
)

// listenAs is listen for intern's jail.
func listenAs(t *testing.T, r *egress.Relay, intern string, kind byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.Serve(intern, kind, c)
		}
	}()
	return ln.Addr().String()
}

// waitOpen waits until intern holds n relay connections.
func waitOpen(t *testing.T, r *egress.Relay, intern string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); r.Open(intern) != n; {
		if time.Now().After(deadline) {
			t.Fatalf("intern %s holds %d relay connections, want %d", intern, r.Open(intern), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// closedWithin reports whether the relay closed c (EOF or reset) within d,
// sending nothing.
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	n, err := c.Read(make([]byte, 1))
	return n == 0 && err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// One intern holding connections past its cap: the excess are closed at
// once (never queued), while another intern's jail still gets its model
// answer; a connection the first intern gives back is its to use again.
func TestRelayCapsEachInternsConnections(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fmt.Fprint(w, "answer")
	}))
	defer upstream.Close()
	const limit = 8
	r := newRelay(t, egress.Config{ModelBaseURL: upstream.URL + "/v1", MaxConnsPerIntern: limit})
	if r.MaxConnsPerIntern() != limit {
		t.Fatalf("cap %d", r.MaxConnsPerIntern())
	}
	a, b := listenAs(t, r, "intern-a", egress.KindModel), listenAs(t, r, "intern-b", egress.KindModel)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range limit {
		c, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	waitOpen(t, r, "intern-a", limit)
	for i := range 4 {
		c, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if !closedWithin(c, 5*time.Second) {
			t.Fatalf("connection %d past the cap was not closed", limit+i+1)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("connection past the cap closed after %v, not at once", d)
		}
		c.Close()
	}
	if n := r.Open("intern-a"); n != limit {
		t.Fatalf("intern-a holds %d, want %d", n, limit)
	}

	// The neighbour's model relay answers, on a fresh connection.
	res, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}).
		Post("http://"+b+"/v1/chat/completions", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(body) != "answer" {
		t.Fatalf("intern-b's model relay: %d %q", res.StatusCode, body)
	}

	// One given back, one more fits.
	held[0].Close()
	held = held[1:]
	waitOpen(t, r, "intern-a", limit-1)
	c, err := net.Dial("tcp", a)
	if err != nil {
		t.Fatal(err)
	}
	held = append(held, c)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("intern-a below its cap again: %v %v", res, err)
	}
}

// An HTTP relay connection with no request for the idle period is closed,
// and the intern's count drops; a tunnel is closed when no byte has passed
// either way for its idle period, not while bytes flow.
func TestRelayClosesIdleConnections(t *testing.T) {
	const idle = 300 * time.Millisecond
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fmt.Fprint(w, "answer")
	}))
	defer upstream.Close()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	r := newRelay(t, egress.Config{ModelBaseURL: upstream.URL, Internet: true, AllowLoopback: true,
		IdleTimeout: idle, TunnelIdleTimeout: idle})

	t.Run("keep-alive", func(t *testing.T) {
		c, err := net.Dial("tcp", listenAs(t, r, "intern-idle", egress.KindModel))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /models HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("%v %v", res, err)
		}
		io.ReadAll(res.Body)
		waitOpen(t, r, "intern-idle", 1)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("an idle keep-alive connection stayed open: %v", err)
		}
		waitOpen(t, r, "intern-idle", 0)
	})

	t.Run("tunnel", func(t *testing.T) {
		addr := listenAs(t, r, "intern-tunnel", egress.KindInternet)
		status, _, c := rawConnect(t, addr, echo.Addr().String())
		if c == nil {
			t.Fatalf("CONNECT: %s", status)
		}
		defer c.Close()
		// Bytes every third of the idle period for three periods: open.
		for i := range 9 {
			msg := fmt.Sprintf("ping %d\n", i)
			c.Write([]byte(msg))
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
				t.Fatalf("tunnel closed while bytes flowed (%d): %q %v", i, got, err)
			}
			time.Sleep(idle / 3)
		}
		waitOpen(t, r, "intern-tunnel", 1)
		// Then nothing: closed, and no longer counted.
		if !closedWithin(c, 5*time.Second) {
			t.Fatal("an idle tunnel stayed open")
		}
		waitOpen(t, r, "intern-tunnel", 0)
	})
}

// With SetGateway the gateway relay serves the gateway's handler in
// process, each request naming the intern whose jail sent it (what the
// exchange limiter keys on), on the same capped, idle-timed connections.
func TestGatewayRelayServesInProcessNamingTheIntern(t *testing.T) {
	r := newRelay(t, egress.Config{})
	r.SetGateway(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		id, ok := relayctx.Intern(req.Context())
		fmt.Fprintf(w, "%s %v", id, ok)
	}))
	for _, intern := range []string{"intern-a", "intern-b"} {
		res, err := http.Get("http://" + listenAs(t, r, intern, egress.KindGateway) + "/api/v1/x")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != intern+" true" {
			t.Fatalf("%s: the gateway saw %q", intern, b)
		}
	}
}

// Hold (intern Pods' model relay, per request) counts against the same
// per-intern cap as relay connections, and only the intern's own.
func TestHoldCountsAgainstTheInternsCap(t *testing.T) {
	r := newRelay(t, egress.Config{MaxConnsPerIntern: 2})
	var releases []func()
	for range 2 {
		release, ok := r.Hold("pod-a")
		if !ok {
			t.Fatal("refused below the cap")
		}
		releases = append(releases, release)
	}
	if _, ok := r.Hold("pod-a"); ok {
		t.Fatal("a request past the cap was held")
	}
	release, ok := r.Hold("pod-b")
	if !ok {
		t.Fatal("another intern refused")
	}
	release()
	releases[0]()
	if _, ok := r.Hold("pod-a"); !ok {
		t.Fatal("refused after one was released")
	}
	if n := r.Open("pod-a"); n != 2 {
		t.Fatalf("pod-a holds %d, want 2", n)
	}
}

// Refusals are logged at most once per period per intern, with the count,
// so an intern at its cap cannot flood the gateway's log either.
func TestRelayLogsRefusalsRateLimited(t *testing.T) {
	var logs syncBuffer
	r := newRelay(t, egress.Config{MaxConnsPerIntern: 1, Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	release, ok := r.Hold("intern-a")
	if !ok {
		t.Fatal("refused below the cap")
	}
	defer release()
	for range 500 {
		a, b := net.Pipe()
		r.Serve("intern-a", egress.KindModel, a)
		b.Close()
	}
	out := logs.String()
	if n := strings.Count(out, "at its cap"); n != 1 || !strings.Contains(out, `"intern":"intern-a"`) || !strings.Contains(out, `"cap":1`) {
		t.Fatalf("%d log lines for 500 refusals:\n%s", n, out)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
