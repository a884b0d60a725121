package httptool_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/httptool"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/vault"
)

const canary = "s3cr3t-CANARY-7f0c/+ &x"

// hit is one request the stand-in server received.
type hit struct {
	host, path, query, auth, body string
}

// upstream is a loopback TLS server standing in for api.example.com and
// other.example.com (its certificate covers *.example.com).
type upstream struct {
	srv  *httptest.Server
	mu   sync.Mutex
	hits []hit
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.hits = append(u.hits, hit{host: r.Host, path: r.URL.Path, query: r.URL.RawQuery, auth: r.Header.Get("Authorization"), body: string(b)})
		u.mu.Unlock()
		switch r.URL.Path {
		case "/echo":
			// Echo what arrived: the secret comes back in a header and the body.
			w.Header().Set("X-Echo", r.Header.Get("Authorization"))
			fmt.Fprintf(w, "auth=%s query=%s body=%s json=%q", r.Header.Get("Authorization"), r.URL.RawQuery, b, r.Header.Get("Authorization"))
		case "/away":
			http.Redirect(w, r, "https://other.example.com"+r.Host[strings.LastIndexByte(r.Host, ':'):]+"/landed", http.StatusTemporaryRedirect)
		case "/away-with-key":
			http.Redirect(w, r, "https://other.example.com"+r.Host[strings.LastIndexByte(r.Host, ':'):]+"/landed?k="+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), http.StatusFound)
		case "/home":
			http.Redirect(w, r, "/echo", http.StatusFound)
		case "/repeat":
			v := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			fmt.Fprint(w, strings.Repeat(v+" ", 12))
		case "/big":
			w.Write([]byte(strings.Repeat("a", 1000)))
		default:
			fmt.Fprint(w, "ok")
		}
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) tool(maxResponse int64) *httptool.Tool {
	return httptool.New(httptool.Options{
		ExtraRoots:    []*x509.Certificate{u.srv.Certificate()},
		AllowLoopback: true,
		MaxResponse:   maxResponse,
		Resolve:       func(string) string { return "127.0.0.1" },
	})
}

// url returns https://<host>:<port><path> for the stand-in.
func (u *upstream) url(host, path string) string {
	addr := u.srv.Listener.Addr().String()
	return "https://" + host + addr[strings.LastIndexByte(addr, ':'):] + path
}

func (u *upstream) all() []hit {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]hit(nil), u.hits...)
}

// releaser asks the vault directly; its refusals are the vault's
// *apierr.Error, as the daemon's releaser passes them on.
func releaser(e *testenv.Env) httptool.Releaser {
	return func(ctx context.Context, name, host string) (string, error) {
		return e.Server.Vault.Release(ctx, vault.ReleaseRequest{InternID: e.InternID, Name: name, Host: host, RunID: "run-test"})
	}
}

func put(t *testing.T, e *testenv.Env, name, host, value string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"hosts": []string{host}, "value": value})
	st, body, _ := e.Do(t, "PUT", "/vault/interns/"+e.InternID+"/secrets/"+name, e.WorkspaceKey, "application/json", string(b))
	if st != 201 {
		t.Fatalf("put: %d %s", st, body)
	}
}

func resultJSON(t *testing.T, r *httptool.Result) string {
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSecretReachesOnlyItsHostAndNeverComesBack(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		up := newUpstream(t)
		tool := up.tool(0)
		put(t, e, "api_key", "api.example.com", canary)
		rel := releaser(e)

		for _, host := range []string{"api.example.com", "API.EXAMPLE.COM."} {
			a := &httptool.Args{Method: "POST", URL: up.url(host, "/echo") + "?key={{secret:api_key}}",
				Headers: map[string]string{"Authorization": "Bearer {{secret:api_key}}"}, Body: ptr(`{"k":"{{secret:api_key}}"}`)}
			res, err := tool.Do(ctx, a, rel)
			if err != nil {
				t.Fatalf("%s: %v", host, err)
			}
			out := resultJSON(t, res)
			if strings.Contains(out, "s3cr3t") || strings.Contains(out, "CANARY") {
				t.Fatalf("%s: the value came back: %s", host, out)
			}
			if !strings.Contains(res.Headers["X-Echo"], "Bearer {{secret:api_key}}") || !strings.Contains(res.Body, "auth=Bearer {{secret:api_key}}") ||
				!strings.Contains(res.Body, `body={"k":"{{secret:api_key}}"}`) || !strings.Contains(res.Body, "query=key={{secret:api_key}}") {
				t.Fatalf("%s: echo not redacted as expected: %s", host, out)
			}
		}
		// A value cut by the response bound leaves no piece behind, wherever
		// the cut falls (the body repeats the value 12 times).
		for max := int64(1); max < 12*int64(len(canary)+1); max += 7 {
			res, err := up.tool(max).Do(ctx, &httptool.Args{URL: up.url("api.example.com", "/repeat"),
				Headers: map[string]string{"Authorization": "Bearer {{secret:api_key}}"}}, rel)
			if err != nil || !res.Truncated || strings.Contains(res.Body, "s3") || len(res.Body) > int(max) {
				t.Fatalf("bound %d: %+v %v", max, res, err)
			}
		}
		hits := up.all()
		if len(hits) != 2+41 || hits[0].auth != "Bearer "+canary || hits[0].body != `{"k":"`+canary+`"}` || !strings.Contains(hits[0].query, "s3cr3t-CANARY") {
			t.Fatalf("the bound host did not receive the value: %+v", hits)
		}

		// Refused destinations: never released, nothing sent. Each refusal
		// carries the vault's (or the tool's) status and reason.
		for _, c := range []struct {
			url, want string
			status    int
			reason    apierr.Reason
		}{
			{up.url("example.com", "/echo"), `secret "api_key" was not released for host "example.com"`, 403, "host_not_allowed"},
			{up.url("www.api.example.com", "/echo"), `not bound to host "www.api.example.com"`, 403, "host_not_allowed"},
			{"https://api.example.com.evil.test/echo", `not bound to host "api.example.com.evil.test"`, 403, "host_not_allowed"},
			{"https://127.0.0.1/echo", "secrets are only sent to DNS hostnames", 400, "bad_request"},
			{"https://[::1]/echo", "secrets are only sent to DNS hostnames", 400, "bad_request"},
			{"https://user:pw@api.example.com/echo", "user information", 400, "bad_request"},
			{"http://api.example.com/echo", "only https", 400, "bad_request"},
		} {
			_, err := tool.Do(ctx, &httptool.Args{URL: c.url, Headers: map[string]string{"Authorization": "Bearer {{secret:api_key}}"}}, rel)
			var te *apierr.Error
			if !errors.As(err, &te) || !strings.Contains(te.Message, c.want) || strings.Contains(te.Message, "s3cr3t") {
				t.Fatalf("%s: %v (want %q)", c.url, err, c.want)
			}
			if te.Status != c.status || te.Reason != c.reason {
				t.Fatalf("%s: %d %q, want %d %q", c.url, te.Status, te.Reason, c.status, c.reason)
			}
		}
		if n := len(up.all()); n != 43 {
			t.Fatalf("refused requests reached the server: %d hits", n)
		}
		// Unknown secret, legacy (unbound) secret.
		v := vaultRowID(t, e)
		e.DB.NewInsert().Model(&store.VaultSecret{VaultID: v, Name: "legacy", Ciphertext: []byte("x"), CreatedAt: store.Now(nil)}).Exec(ctx)
		for _, c := range []struct {
			name, want string
			status     int
			reason     apierr.Reason
		}{{"nope", "no secret \"nope\"", 404, "not_found"}, {"legacy", "bound to no host", 403, "secret_unbound"}, {"Bad Name", "name", 400, "bad_request"}} {
			_, err := tool.Do(ctx, &httptool.Args{URL: up.url("api.example.com", "/echo"), Body: ptr("{{secret:" + c.name + "}}")}, rel)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%s: %v", c.name, err)
			}
			if !apierr.Is(err, c.status, c.reason) {
				t.Fatalf("%s: %v, want %d %q", c.name, err, c.status, c.reason)
			}
		}
		// Every decision is audited, never with the value.
		var rows []store.VaultRelease
		e.DB.NewSelect().Model(&rows).Scan(ctx)
		outcomes := map[string]int{}
		for _, r := range rows {
			outcomes[r.Outcome+"/"+r.Reason]++
			if r.RunID == nil || *r.RunID != "run-test" || strings.Contains(fmt.Sprint(r), "s3cr3t") {
				t.Fatalf("audit row: %+v", r)
			}
		}
		if outcomes["released/host_match"] != 43 || outcomes["refused/host_not_allowed"] != 3 || outcomes["refused/unbound"] != 1 ||
			outcomes["refused/secret_not_found"] != 1 || outcomes["refused/invalid_host"] != 2 {
			t.Fatalf("audit: %v", outcomes)
		}
	})
}

func ptr(s string) *string { return &s }

func vaultRowID(t *testing.T, e *testenv.Env) string {
	var id string
	if err := e.DB.NewSelect().TableExpr("vaults").Column("id").Where("owner_id = ?", e.InternID).Scan(context.Background(), &id); err != nil {
		t.Fatal(err)
	}
	return id
}

func TestRedirectsNeverCarryAValueToAnotherHost(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		up := newUpstream(t)
		tool := up.tool(0)
		put(t, e, "api_key", "api.example.com", canary)
		rel := releaser(e)
		auth := map[string]string{"Authorization": "Bearer {{secret:api_key}}", "Accept": "text/plain"}

		// Same host: followed, the header goes again.
		res, err := tool.Do(ctx, &httptool.Args{URL: up.url("api.example.com", "/home"), Headers: auth}, rel)
		if err != nil || res.Status != 200 || !strings.Contains(res.Body, "auth=Bearer {{secret:api_key}}") || len(res.Redirects) != 1 {
			t.Fatalf("same-host redirect: %+v %v", res, err)
		}
		// Another host: followed without the secret header.
		res, err = tool.Do(ctx, &httptool.Args{URL: up.url("api.example.com", "/away"), Headers: auth}, rel)
		if err != nil || res.Status != 200 {
			t.Fatalf("cross-host redirect: %+v %v", res, err)
		}
		// A redirect whose URL carries the value to another host: not followed.
		res, err = tool.Do(ctx, &httptool.Args{URL: up.url("api.example.com", "/away-with-key"), Headers: auth}, rel)
		if err != nil || res.Status != 302 || !strings.Contains(res.Note, "not followed") || strings.Contains(resultJSON(t, res), "s3cr3t") {
			t.Fatalf("leaky redirect: %+v %v", res, err)
		}
		// A 307 of a body holding a secret to another host: not followed.
		res, err = tool.Do(ctx, &httptool.Args{Method: "POST", URL: up.url("api.example.com", "/away"), Body: ptr("{{secret:api_key}}")}, rel)
		if err != nil || res.Status != 307 || !strings.Contains(res.Note, "not followed") {
			t.Fatalf("307 with a secret body: %+v %v", res, err)
		}
		for _, h := range up.all() {
			if strings.HasPrefix(h.host, "other.example.com") && (strings.Contains(h.auth+h.body+h.query, "s3cr3t") || strings.Contains(h.query, "CANARY")) {
				t.Fatalf("another host received the value: %+v", h)
			}
		}
		landed := 0
		for _, h := range up.all() {
			if h.path == "/landed" {
				landed++
				if h.auth != "" {
					t.Fatalf("secret header crossed hosts: %+v", h)
				}
			}
		}
		if landed != 1 {
			t.Fatalf("landed %d times", landed)
		}
	})
}

func TestNonPublicDestinationsAreRefusedAtDialTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, ip := range []string{"127.0.0.1", "10.0.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0"} {
		tool := httptool.New(httptool.Options{Resolve: func(string) string { return ip }})
		_, err := tool.Do(ctx, &httptool.Args{URL: "https://public.example.com/"}, nil)
		if err == nil || !strings.Contains(err.Error(), "refused to connect to a non-public address") {
			t.Fatalf("%s: %v", ip, err)
		}
	}
	// Literal addresses too, without any resolver.
	tool := httptool.New(httptool.Options{})
	for _, u := range []string{"https://127.0.0.1/", "https://169.254.169.254/latest/meta-data/", "https://[::1]/", "https://[fe80::1]/"} {
		_, err := tool.Do(ctx, &httptool.Args{URL: u}, nil)
		if err == nil || !strings.Contains(err.Error(), "refused to connect to a non-public address") {
			t.Fatalf("%s: %v", u, err)
		}
	}
}

func TestTimeBound(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer srv.Close()
	tool := httptool.New(httptool.Options{ExtraRoots: []*x509.Certificate{srv.Certificate()}, AllowLoopback: true,
		Resolve: func(string) string { return "127.0.0.1" }, Timeout: 300 * time.Millisecond})
	a := srv.Listener.Addr().String()
	t0 := time.Now()
	_, err := tool.Do(context.Background(), &httptool.Args{URL: "https://api.example.com" + a[strings.LastIndexByte(a, ':'):] + "/"}, nil)
	if err == nil || !strings.Contains(err.Error(), "timed out") || time.Since(t0) > 3*time.Second {
		t.Fatalf("%v after %s", err, time.Since(t0))
	}
}

func TestResponseBoundAndMalformedArguments(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	ctx := context.Background()
	// At the bound: whole; past it: truncated.
	res, err := up.tool(1000).Do(ctx, &httptool.Args{URL: up.url("api.example.com", "/big")}, nil)
	if err != nil || len(res.Body) != 1000 || res.Truncated {
		t.Fatalf("at the bound: %d %v %v", len(res.Body), res.Truncated, err)
	}
	res, err = up.tool(999).Do(ctx, &httptool.Args{URL: up.url("api.example.com", "/big")}, nil)
	if err != nil || len(res.Body) != 999 || !res.Truncated {
		t.Fatalf("past the bound: %d %v %v", len(res.Body), res.Truncated, err)
	}
	for _, raw := range []string{``, `{}`, `[]`, `{"url":1}`, `{"url":"x","extra":1}`, `{"url":"x"} {}`, `{"url":"x","headers":{"a":1}}`} {
		if _, err := httptool.DecodeArgs([]byte(raw)); err == nil || !strings.Contains(err.Error(), "expected {\"url\"") {
			t.Fatalf("%s: %v", raw, err)
		}
	}
	for _, a := range []httptool.Args{
		{Method: "TRACE", URL: "https://api.example.com/"},
		{URL: "https://api.example.com/", Headers: map[string]string{"Host": "evil.test"}},
		{URL: "https://api.example.com/", Headers: map[string]string{"X-{{secret:k}}": "v"}},
		{URL: "https://{{secret:k}}.example.com/"},
	} {
		if _, err := up.tool(0).Do(ctx, &a, nil); err == nil {
			t.Fatalf("%+v accepted", a)
		}
	}
	if len(up.all()) != 2 {
		t.Fatalf("refused calls reached the server: %+v", up.all())
	}
}

// In a jail the tool reaches the internet only through the egress proxy:
// every request is a CONNECT to it (the destination resolved there), and
// nothing is dialled directly.
func TestRequestsGoThroughTheProxy(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan string, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				seen <- req.Method + " " + req.Host
				dst, err := net.Dial("tcp", up.srv.Listener.Addr().String()) // the proxy's own resolution
				if err != nil {
					return
				}
				defer dst.Close()
				io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
				go io.Copy(dst, br)
				io.Copy(c, dst)
			}()
		}
	}()
	proxy, _ := url.Parse("http://" + ln.Addr().String())
	tool := httptool.New(httptool.Options{ExtraRoots: []*x509.Certificate{up.srv.Certificate()}, Proxy: proxy,
		// Were anything dialled directly, it would go here and be refused.
		Resolve: func(string) string { return "127.0.0.1" }})
	res, err := tool.Do(context.Background(), &httptool.Args{URL: up.url("api.example.com", "/hello")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != 200 {
		t.Fatalf("through the proxy: %+v", res)
	}
	_, port, _ := net.SplitHostPort(up.srv.Listener.Addr().String())
	if got := <-seen; got != "CONNECT api.example.com:"+port {
		t.Fatalf("the proxy saw %q", got)
	}
}
