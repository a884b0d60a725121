package server_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// tally counts a load's answers by status, and checks each one as it
// comes: never a 500, and every 503 says when to retry in its door's body.
type tally struct {
	mu     sync.Mutex
	counts map[int]int
	bad    []string
	// lastFail and firstOKAfter time the recovery.
	lastFail time.Time
}

func (c *tally) add(status int, h http.Header, body string, shape string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[int]int{}
	}
	c.counts[status]++
	if status >= 500 {
		c.lastFail = time.Now()
	}
	switch {
	case status >= 500 && status != 503:
		c.bad = append(c.bad, fmt.Sprintf("%d %s", status, body))
	case status == 503:
		if ra, err := strconv.Atoi(h.Get("Retry-After")); err != nil || ra < 1 {
			c.bad = append(c.bad, fmt.Sprintf("503 without Retry-After: %s", body))
		}
		var ok bool
		switch shape {
		case "rest":
			ok = testenv.ErrorShape(503, body) == nil
		case "connect":
			var v struct{ Code string }
			ok = json.Unmarshal([]byte(body), &v) == nil && v.Code == "unavailable"
		case "ready":
			ok = strings.Contains(body, "database unavailable")
		}
		if !ok {
			c.bad = append(c.bad, fmt.Sprintf("503 %s body: %s", shape, body))
		}
	}
}

// load sends a mix of reads and writes over both doors until stop is
// closed: Connect ListWorkspaces (a read and the auth lookup), REST
// workspace creation (a write), and /readyz.
func load(t *testing.T, e *testenv.Env, c *tally, stop <-chan struct{}, workers int) *sync.WaitGroup {
	var wg sync.WaitGroup
	client := &http.Client{Transport: e.HTTPClient().Transport, Timeout: 10 * time.Second}
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var req *http.Request
				shape := "rest"
				switch (w + i) % 3 {
				case 0:
					req, _ = http.NewRequest("POST", e.URL+"/cohort.v1.WorkspaceService/ListWorkspaces", strings.NewReader("{}"))
					shape = "connect"
				case 1:
					req, _ = http.NewRequest("POST", e.URL+"/workspaces", strings.NewReader(fmt.Sprintf(`{"name": "load %d %d"}`, w, i)))
				case 2:
					req, _ = http.NewRequest("GET", e.HTTP.URL+"/readyz", nil)
					shape = "ready"
				}
				req.Header.Set("Authorization", "Bearer "+e.ManagementKey)
				req.Header.Set("Content-Type", "application/json")
				res, err := client.Do(req)
				if err != nil {
					c.mu.Lock()
					c.bad = append(c.bad, "transport: "+err.Error())
					c.mu.Unlock()
					continue
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				c.add(res.StatusCode, res.Header, string(b), shape)
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	return &wg
}

func (c *tally) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Logf("statuses: %v", c.counts)
	for _, b := range c.bad {
		t.Error(b)
	}
	if c.counts[200]+c.counts[201] == 0 {
		t.Error("nothing succeeded")
	}
}

// recovered waits until a read and a write both succeed, and returns how
// long that took.
func recovered(t *testing.T, e *testenv.Env) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < 30*time.Second {
		s1, _, _ := e.Do(t, "POST", "/cohort.v1.WorkspaceService/ListWorkspaces", e.ManagementKey, "application/json", "{}")
		s2, _, _ := e.Do(t, "POST", "/workspaces", e.ManagementKey, "application/json", `{"name": "after"}`)
		if s1 == 200 && s2 == 201 {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the gateway did not recover within 30 s")
	return 0
}

// TestPostgresBackendsTerminated terminates every backend of the test's
// own database (pg_terminate_backend, as an administrator or a failover
// does) five times while a load runs: no request answers 500, a request
// that fails answers 503 with Retry-After, and the log says "database
// unavailable" about once per outage, not once per request.
func TestPostgresBackendsTerminated(t *testing.T) {
	db := storetest.Postgres(t)
	e := testenv.New(t, db)
	var name string
	if err := db.QueryRowContext(context.Background(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("pgx", storetest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()

	var c tally
	stop := make(chan struct{})
	wg := load(t, e, &c, stop, 4)
	killed := 0
	for range 5 {
		time.Sleep(400 * time.Millisecond)
		var n int
		if err := admin.QueryRow(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		killed += n
	}
	time.Sleep(400 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("terminated %d backends; recovered in %v", killed, recovered(t, e))
	if killed == 0 {
		t.Fatal("no backend was terminated")
	}
	c.check(t)
	if n := strings.Count(e.Logs(), `"msg":"database unavailable"`); c.counts[503] > 0 && (n == 0 || n > 2) {
		t.Errorf(`%d 503s logged "database unavailable" %d times`, c.counts[503], n)
	}
	if strings.Contains(e.Logs(), `"status":500`) {
		t.Error("a request was logged as 500")
	}
}

// proxy is a TCP proxy to PostgreSQL that can go away as a restarting
// server does: its connections cut, its port refusing for a while.
type proxy struct {
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	p.serve(ln)
	t.Cleanup(func() { p.down() })
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[s] = true, true
			p.mu.Unlock()
			go func() { io.Copy(s, c); s.Close() }()
			go func() { io.Copy(c, s); c.Close() }()
		}
	}()
}

// down cuts every connection and closes the port.
func (p *proxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// up listens on the same port again.
func (p *proxy) up(t *testing.T) {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.serve(ln)
}

// TestPostgresRestart takes the database away for 2.4 s (every connection
// cut, the port refusing, as a restart does; through a proxy, so that the
// PostgreSQL server other tests use keeps running) while a load runs: no
// 500, failures are 503 with Retry-After, and the gateway serves again at
// once after.
func TestPostgresRestart(t *testing.T) {
	u, err := url.Parse(storetest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, u.Host)
	u.Host = p.addr
	ctx := context.Background()
	db, err := store.Open(ctx, u.String(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	e := testenv.New(t, db)

	var c tally
	stop := make(chan struct{})
	wg := load(t, e, &c, stop, 4)
	time.Sleep(500 * time.Millisecond)
	p.down()
	time.Sleep(2400 * time.Millisecond)
	p.up(t)
	back := time.Now()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("recovered %v after the database came back", recovered(t, e))
	c.check(t)
	c.mu.Lock()
	if !c.lastFail.IsZero() && c.lastFail.Sub(back) > time.Second {
		t.Errorf("requests still failed %v after the database came back", c.lastFail.Sub(back))
	}
	c.mu.Unlock()
}

// TestSQLiteBusy: a write that finds the SQLite database locked past its
// busy timeout (another process holds the write lock) answers 503 with
// Retry-After, not 500.
func TestSQLiteBusy(t *testing.T) {
	db := storetest.SQLite(t)
	e := testenv.New(t, db)
	path := sqlitePath(t, db)
	other, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	status, body, h := e.Do(t, "POST", "/workspaces", e.ManagementKey, "application/json", `{"name": "locked out"}`)
	conn.ExecContext(context.Background(), "ROLLBACK")
	if status != 503 || h.Get("Retry-After") == "" {
		t.Fatalf("%d (Retry-After %q): %s", status, h.Get("Retry-After"), body)
	}
	if err := testenv.ErrorShape(503, body); err != nil {
		t.Fatal(err)
	}
	if status, body, _ := e.Do(t, "POST", "/workspaces", e.ManagementKey, "application/json", `{"name": "after"}`); status != 201 {
		t.Fatalf("after the lock: %d %s", status, body)
	}
}

func sqlitePath(t *testing.T, db *bun.DB) string {
	var seq int
	var name, file string
	if err := db.QueryRowContext(context.Background(), "PRAGMA database_list").Scan(&seq, &name, &file); err != nil {
		t.Fatal(err)
	}
	return file
}
