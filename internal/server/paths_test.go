package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/config"
)

func get(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func request(t *testing.T, method, url string, header ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// Paths that are neither the API nor the console are not found: under
// /api/ in the API's error shape, elsewhere in plain text; the console's
// page and files still load, and /version says which build runs.
func TestTruthfulPaths(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(newServer(t, noProvisioner(), deps(t)).Handler())
	t.Cleanup(srv.Close)

	for _, p := range []string{"/api/x", "/api/v1/nothing", "/api/v2/workspaces", "/api/v1/cohort.v1.NoService/X"} {
		res, body := get(t, request(t, "GET", srv.URL+p))
		var e struct {
			Error struct {
				Code    int
				Message string
			}
		}
		if err := json.Unmarshal([]byte(body), &e); res.StatusCode != 404 || err != nil || e.Error.Code != 404 || e.Error.Message == "" ||
			!strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
			t.Errorf("GET %s: %d %q (%v)", p, res.StatusCode, body, err)
		}
	}
	for _, p := range []string{"/metrics", "/openapi.json", "/favicon.ico", "/interns", "/assets/", "/assets/nothing.js", "/index.htm", "/.env"} {
		for _, m := range []string{"GET", "POST"} {
			res, body := get(t, request(t, m, srv.URL+p))
			if res.StatusCode != 404 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") || strings.Contains(body, "<") {
				t.Errorf("%s %s: %d %s %q", m, p, res.StatusCode, res.Header.Get("Content-Type"), body)
			}
		}
	}

	// The console routes in the fragment: "/" is its page for every route,
	// and the page's own script and style load.
	res, page := get(t, request(t, "GET", srv.URL+"/"))
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") || !strings.Contains(page, `id="app"`) {
		t.Fatalf("GET /: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	if res, _ := get(t, request(t, "GET", srv.URL+"/index.html")); res.StatusCode != 200 {
		t.Errorf("GET /index.html: %d", res.StatusCode)
	}
	assets := 0
	for _, part := range strings.Split(page, `"`) {
		if strings.HasPrefix(part, "/assets/") {
			assets++
			if res, _ := get(t, request(t, "GET", srv.URL+part)); res.StatusCode != 200 {
				t.Errorf("GET %s: %d", part, res.StatusCode)
			}
		}
	}
	if assets == 0 {
		t.Error("the console's page names no assets")
	}
	if res, _ := get(t, request(t, "DELETE", srv.URL+"/")); res.StatusCode != 405 {
		t.Errorf("DELETE /: %d", res.StatusCode)
	}

	res, body := get(t, request(t, "GET", srv.URL+"/version"))
	var v struct {
		Version, Commit, Go string
		Modified            *bool
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || res.StatusCode != 200 || v.Version == "" || v.Commit == "" || v.Go != runtime.Version() || v.Modified == nil {
		t.Fatalf("GET /version: %d %s", res.StatusCode, body)
	}
}

// Browsers on a listed origin may call the REST and Connect doors: their
// preflights are answered with what Connect clients send, and the answers
// are readable. Any other origin gets no CORS header at all.
func TestCORS(t *testing.T) {
	t.Parallel()
	cfg := noProvisioner()
	cfg.Server.CORSAllowOrigins = []string{"https://App.example.com", "http://localhost:5173"}
	srv := httptest.NewServer(newServer(t, cfg, deps(t)).Handler())
	t.Cleanup(srv.Close)

	const allowed, other = "https://app.example.com", "https://evil.example.com"
	connectURL := srv.URL + Prefix + cohortv1connect.WorkspaceServiceListWorkspacesProcedure
	for _, c := range []struct{ url, method, headers string }{
		{srv.URL + Prefix + "/vault/secrets/x", "PUT", "authorization,content-type"},
		{srv.URL + Prefix + "/interns/i/chat/completions", "POST", "authorization,content-type"},
		{connectURL, "POST", "authorization,connect-protocol-version,connect-timeout-ms,content-type"},
	} {
		res, _ := get(t, request(t, "OPTIONS", c.url, "Origin", allowed,
			"Access-Control-Request-Method", c.method, "Access-Control-Request-Headers", c.headers))
		h := res.Header
		if res.StatusCode != 204 || h.Get("Access-Control-Allow-Origin") != allowed ||
			!strings.Contains(h.Get("Access-Control-Allow-Methods"), c.method) || h.Get("Access-Control-Max-Age") == "" {
			t.Errorf("preflight %s from %s: %d %v", c.url, allowed, res.StatusCode, h)
		}
		for _, want := range strings.Split(c.headers, ",") {
			if !strings.Contains(strings.ToLower(h.Get("Access-Control-Allow-Headers")), want) {
				t.Errorf("preflight %s: %s not allowed: %q", c.url, want, h.Get("Access-Control-Allow-Headers"))
			}
		}
		res, _ = get(t, request(t, "OPTIONS", c.url, "Origin", other,
			"Access-Control-Request-Method", c.method, "Access-Control-Request-Headers", c.headers))
		if res.StatusCode == 204 || res.StatusCode == 200 || accessControl(res.Header) != "" {
			t.Errorf("preflight %s from %s: %d %s", c.url, other, res.StatusCode, accessControl(res.Header))
		}
	}

	// The answers themselves: a refusal (no key) is readable by the listed
	// origin, with Connect's and Retry-After exposed; not by another.
	connectReq := request(t, "POST", connectURL, "Content-Type", "application/json", "Connect-Protocol-Version", "1")
	connectReq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("{}")), nil }
	connectReq.Body, _ = connectReq.GetBody()
	connectReq.ContentLength = 2
	for _, r := range []*http.Request{request(t, "GET", srv.URL+Prefix+"/vault/secrets"), connectReq} {
		r.Header.Set("Origin", allowed)
		res, _ := get(t, r)
		if res.StatusCode != 401 || res.Header.Get("Access-Control-Allow-Origin") != allowed ||
			!strings.Contains(res.Header.Get("Access-Control-Expose-Headers"), "Grpc-Status") ||
			!strings.Contains(res.Header.Get("Access-Control-Expose-Headers"), "Retry-After") {
			t.Errorf("%s %s from %s: %d %v", r.Method, r.URL.Path, allowed, res.StatusCode, res.Header)
		}
		r = r.Clone(r.Context())
		if r.GetBody != nil {
			r.Body, _ = r.GetBody()
		}
		r.Header.Set("Origin", other)
		if res, _ := get(t, r); res.StatusCode != 401 || accessControl(res.Header) != "" {
			t.Errorf("%s %s from %s: %d %s", r.Method, r.URL.Path, other, res.StatusCode, accessControl(res.Header))
		}
	}
	// Outside the API, none: the console is same-origin only.
	if res, _ := get(t, request(t, "GET", srv.URL+"/", "Origin", allowed)); accessControl(res.Header) != "" {
		t.Errorf("GET / from %s: %s", allowed, accessControl(res.Header))
	}
}

// Without --cors-allow-origins no origin gets a CORS header.
func TestNoCORSByDefault(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(newServer(t, noProvisioner(), deps(t)).Handler())
	t.Cleanup(srv.Close)
	res, _ := get(t, request(t, "OPTIONS", srv.URL+Prefix+"/vault/secrets", "Origin", "https://app.example.com",
		"Access-Control-Request-Method", "GET"))
	if accessControl(res.Header) != "" || res.StatusCode == 204 {
		t.Fatalf("%d %s", res.StatusCode, accessControl(res.Header))
	}
}

func TestParseOrigins(t *testing.T) {
	t.Parallel()
	got, err := config.ParseOrigins([]string{"https://App.Example.com", "http://localhost:5173/"})
	if err != nil || strings.Join(got, " ") != "https://app.example.com http://localhost:5173" {
		t.Fatalf("%q %v", got, err)
	}
	for _, bad := range []string{"*", "app.example.com", "https://app.example.com/path", "ftp://x", "https://u@x", "https://x?q"} {
		if _, err := config.ParseOrigins([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	cfg := noProvisioner()
	cfg.Server.CORSAllowOrigins = []string{"*"}
	if _, err := New(t.Context(), cfg, deps(t)); err == nil || !strings.Contains(err.Error(), "--cors-allow-origins") {
		t.Fatalf("New: %v", err)
	}
}

// corsHeaders are the Access-Control-* headers of an answer.
func accessControl(h http.Header) string {
	var out []string
	for k := range h {
		if strings.HasPrefix(k, "Access-Control-") {
			out = append(out, k)
		}
	}
	return strings.Join(out, ",")
}
