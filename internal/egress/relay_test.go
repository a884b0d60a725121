package egress_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/safehttp"
)

const (
	realKey     = "sk-real-model-key-canary"
	placeholder = "cohort-placeholder"
)

// listen serves every connection to the returned address with r.Serve, as
// a jail's relay hands them over.
func listen(t *testing.T, r *egress.Relay, kind byte) string {
	t.Helper()
	return listenAs(t, r, "intern-a", kind)
}

func newRelay(t *testing.T, cfg egress.Config) *egress.Relay {
	t.Helper()
	r, err := egress.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// The model relay puts the real key where the agent wrote the placeholder,
// over TLS to the real endpoint, streams each event as it comes and never
// hands the key back in a response header.
func TestModelRelaySubstitutesTheKeyAndStreams(t *testing.T) {
	next := make(chan struct{})
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/chat/completions" || req.Header.Get("Authorization") != "Bearer "+realKey {
			http.Error(w, fmt.Sprintf("path %s auth %q", req.URL.Path, req.Header.Get("Authorization")), http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Echo-Key", "Bearer "+realKey)
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-next
		fmt.Fprint(w, "data: two\n\n")
	}))
	defer upstream.Close()
	r := newRelay(t, egress.Config{ModelBaseURL: upstream.URL + "/v1", ModelAPIKey: realKey, Placeholder: placeholder,
		ModelRoots: []*x509.Certificate{upstream.Certificate()}})
	addr := listen(t, r, egress.KindModel)
	base := r.InJailModelURL(addr)
	if base != "http://"+addr+"/v1" {
		t.Fatalf("in-jail model URL %q", base)
	}

	req, _ := http.NewRequest("POST", base+"/chat/completions", strings.NewReader(`{"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+placeholder)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	for name, vals := range res.Header {
		if strings.Contains(strings.Join(vals, " "), realKey) {
			t.Errorf("response header %s carries the real key", name)
		}
	}
	br := bufio.NewReader(res.Body)
	// The first event arrives while the upstream still holds the second.
	first := make(chan string, 1)
	go func() {
		line, _ := br.ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if line != "data: one\n" {
			t.Fatalf("first line %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first event was held back until the stream ended")
	}
	close(next)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "data: two") {
		t.Fatalf("rest %q", rest)
	}
}

// Without the placeholder the agent's own header passes unchanged; an
// unreachable endpoint answers 502 with a body that names neither the key
// nor the endpoint's address.
func TestModelRelayPassesOtherKeysAndHidesUpstreamErrors(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fmt.Fprint(w, req.Header.Get("Authorization"))
	}))
	r := newRelay(t, egress.Config{ModelBaseURL: upstream.URL, ModelAPIKey: realKey, Placeholder: placeholder})
	addr := listen(t, r, egress.KindModel)
	req, _ := http.NewRequest("GET", "http://"+addr+"/models", nil)
	req.Header.Set("Authorization", "Bearer the-agents-own")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(b) != "Bearer the-agents-own" {
		t.Fatalf("upstream saw %q", b)
	}

	upstream.Close()
	req, _ = http.NewRequest("GET", "http://"+addr+"/models", nil)
	req.Header.Set("Authorization", "Bearer "+placeholder)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	u, _ := url.Parse(upstream.URL)
	if res.StatusCode != http.StatusBadGateway || strings.Contains(string(b), realKey) || strings.Contains(string(b), u.Port()) {
		t.Fatalf("unreachable endpoint: %d %q", res.StatusCode, b)
	}
}

func TestNewRejectsABadModelURL(t *testing.T) {
	for _, bad := range []string{"ftp://x", "http://", "::"} {
		if _, err := egress.New(egress.Config{ModelBaseURL: bad}); err == nil || !strings.Contains(err.Error(), "model base URL") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// proxyClient sends requests through the internet relay at addr.
func proxyClient(addr string) *http.Client {
	u, _ := url.Parse("http://" + addr)
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u)}, Timeout: 20 * time.Second}
}

// rawConnect sends one CONNECT and returns the status line and the body of
// a refusal.
func rawConnect(t *testing.T, relay, dest string) (string, string, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", relay)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		c.Close()
		return res.Status, string(b), nil
	}
	return res.Status, "", c
}

// The internet relay refuses the gateway's loopback services, private
// ranges and link-local metadata addresses, with 403 and a plain reason.
func TestInternetRelayRefusesLoopbackAndPrivate(t *testing.T) {
	r := newRelay(t, egress.Config{Internet: true})
	addr := listen(t, r, egress.KindInternet)
	for _, dest := range []string{"127.0.0.1:5432", "127.0.0.1:6379", "[::1]:5432", "10.0.0.1:443", "192.168.1.1:80",
		"172.16.0.1:443", "169.254.169.254:80", "0.0.0.0:22", "localhost:5432"} {
		status, body, c := rawConnect(t, addr, dest)
		if c != nil {
			c.Close()
			t.Errorf("CONNECT %s: tunnel opened", dest)
			continue
		}
		if !strings.HasPrefix(status, "403") || strings.TrimSpace(body) != "the destination is not allowed" {
			t.Errorf("CONNECT %s: %s %q", dest, status, body)
		}
	}
	res, err := proxyClient(addr).Get("http://127.0.0.1:6379/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("absolute-form GET to loopback: %d", res.StatusCode)
	}
}

// Where the guard allows the address (loopback, for this test), CONNECT
// opens a working tunnel and absolute-form requests are forwarded without
// the hop-by-hop headers.
func TestInternetRelayTunnelsAndForwards(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fmt.Fprintf(w, "%s %s proxy-auth=%q", req.Method, req.URL.Path, req.Header.Get("Proxy-Authorization"))
	}))
	defer upstream.Close()
	r := newRelay(t, egress.Config{Internet: true, AllowLoopback: true})
	addr := listen(t, r, egress.KindInternet)

	req, _ := http.NewRequest("GET", upstream.URL+"/page", nil)
	req.Header.Set("Proxy-Authorization", "Basic eDp5")
	res, err := proxyClient(addr).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(b) != `GET /page proxy-auth=""` {
		t.Fatalf("forwarded: %d %q", res.StatusCode, b)
	}

	u, _ := url.Parse(upstream.URL)
	status, _, c := rawConnect(t, addr, u.Host)
	if c == nil {
		t.Fatalf("CONNECT: %s", status)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /tunnel HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", u.Host)
	out, _ := io.ReadAll(c)
	if !strings.Contains(string(out), "GET /tunnel") {
		t.Fatalf("through the tunnel: %q", out)
	}
}

func TestInternetRelayRules(t *testing.T) {
	off := newRelay(t, egress.Config{Internet: false, AllowLoopback: true})
	status, body, c := rawConnect(t, listen(t, off, egress.KindInternet), "127.0.0.1:1")
	if c != nil || !strings.HasPrefix(status, "403") || !strings.Contains(body, "disabled") {
		t.Errorf("internet off: %s %q", status, body)
	}

	on := newRelay(t, egress.Config{Internet: true})
	addr := listen(t, on, egress.KindInternet)
	res, err := http.Get("http://" + addr + "/origin-form")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "proxy") {
		t.Errorf("origin-form request: %d %q", res.StatusCode, b)
	}
}

// The gateway relay is a plain splice to the gateway's listener, half
// closes included; after Close the relay refuses new connections.
func TestGatewayRelaySplicesAndCloseRefuses(t *testing.T) {
	gw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	go func() {
		for {
			c, err := gw.Accept()
			if err != nil {
				return
			}
			go func() {
				b, _ := io.ReadAll(c)
				c.Write([]byte("echo:" + string(b)))
				c.Close()
			}()
		}
	}()
	r, err := egress.New(egress.Config{GatewayAddr: gw.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	addr := listen(t, r, egress.KindGateway)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("hello"))
	c.(*net.TCPConn).CloseWrite()
	out, _ := io.ReadAll(c)
	c.Close()
	if string(out) != "echo:hello" {
		t.Fatalf("through the gateway relay: %q", out)
	}

	r.Close()
	c, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("late"))
	out, err = io.ReadAll(c)
	c.Close()
	if len(out) != 0 {
		t.Fatalf("a closed relay answered %q (%v)", out, err)
	}
}

// A jail's own upstream (a third-party agent's provider) gets the key its
// lookup returns, in headers and in the query, asked per request; a failed
// lookup answers 401 with the reason and never reaches the upstream.
func TestServeModelUsesTheJailsUpstreamAndKey(t *testing.T) {
	var hits int
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		hits++
		if req.Header.Get("X-Api-Key") != realKey || req.URL.RawQuery != "beta=true" || req.URL.Path != "/v1/messages" {
			http.Error(w, "bad key "+req.Header.Get("X-Api-Key"), http.StatusUnauthorized)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer upstream.Close()
	// The relay's own endpoint is elsewhere: the jail's upstream wins.
	r := newRelay(t, egress.Config{ModelBaseURL: "https://model.invalid/v1", ModelAPIKey: "sk-other", Placeholder: placeholder, AllowLoopback: true})
	lookups := 0
	fail := false
	key := func(ctx context.Context) (string, error) {
		lookups++
		if fail {
			return "", fmt.Errorf("no vault secret ANTHROPIC_API_KEY bound to %s", "api.anthropic.com")
		}
		return realKey, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.ServeModel("intern-a", c, upstream.URL, key)
		}
	}()
	send := func() (int, string) {
		req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/v1/messages?beta=true", strings.NewReader("{}"))
		req.Header.Set("X-Api-Key", placeholder)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := send(); code != 200 || body != "ok" {
		t.Fatalf("relayed: %d %s", code, body)
	}
	fail = true
	code, body := send()
	if code != http.StatusUnauthorized || !strings.Contains(body, "ANTHROPIC_API_KEY") || strings.Contains(body, realKey) {
		t.Fatalf("failed lookup: %d %s", code, body)
	}
	if hits != 1 || lookups != 2 {
		t.Fatalf("upstream hits %d, key lookups %d; want 1 and 2", hits, lookups)
	}
}

// An upstream may answer before it has read the whole request (a model
// streams as soon as it has parsed the prompt): the relay keeps passing the
// body on while the answer streams back, on both relays.
func TestRelaysStreamWhileTheBodyIsStillComing(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: started\n\n")
		w.(http.Flusher).Flush()
		b, err := io.ReadAll(req.Body)
		fmt.Fprintf(w, "data: got %q err=%v\n\n", b, err)
	}))
	defer upstream.Close()
	model := newRelay(t, egress.Config{ModelBaseURL: upstream.URL, AllowLoopback: true})
	internet := newRelay(t, egress.Config{Internet: true, AllowLoopback: true})
	for _, c := range []struct {
		name   string
		url    string
		client *http.Client
	}{
		{"model", "http://" + listen(t, model, egress.KindModel) + "/responses", http.DefaultClient},
		{"internet", upstream.URL + "/post", proxyClient(listen(t, internet, egress.KindInternet))},
	} {
		t.Run(c.name, func(t *testing.T) {
			pr, pw := io.Pipe()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", c.url, pr)
			req.ContentLength = int64(len("first,second"))
			type result struct {
				res *http.Response
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := c.client.Do(req)
				done <- result{res, err}
			}()
			pw.Write([]byte("first,"))
			var r result
			select {
			case r = <-done:
			case <-ctx.Done():
				t.Fatal("no answer while the body was still coming")
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			defer r.res.Body.Close()
			br := bufio.NewReader(r.res.Body)
			if line, _ := br.ReadString('\n'); line != "data: started\n" {
				t.Fatalf("first line %q", line)
			}
			// The rest of the body only now: the answer has begun.
			pw.Write([]byte("second"))
			pw.Close()
			rest, err := io.ReadAll(br)
			if err != nil || !strings.Contains(string(rest), `data: got "first,second" err=<nil>`) {
				t.Fatalf("rest %q err %v", rest, err)
			}
		})
	}
}

// The operator's allowlist opens exactly what it lists: a loopback range
// reaches a .localhost name (RFC 6761) and that address; a listed
// hostname never reaches loopback; other private and loopback
// destinations stay refused, and the metadata address always is.
func TestInternetRelayOpensOnlyWhatTheOperatorListed(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fmt.Fprintf(w, "reached %s", req.Host)
	}))
	defer upstream.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(upstream.URL, "http://"))
	get := func(t *testing.T, allow []string, dest string) (int, string) {
		t.Helper()
		list, err := safehttp.ParseAllowlist(allow)
		if err != nil {
			t.Fatal(err)
		}
		addr := listen(t, newRelay(t, egress.Config{Internet: true, Allow: list}), egress.KindInternet)
		res, err := proxyClient(addr).Get("http://" + dest + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, c := range []struct {
		allow []string
		dest  string
		ok    bool
	}{
		{[]string{"127.0.0.1/32"}, "target.localhost:" + port, true},
		{[]string{"127.0.0.1"}, "127.0.0.1:" + port, true},
		{nil, "target.localhost:" + port, false},
		{[]string{"10.0.0.0/8"}, "target.localhost:" + port, false},
		{[]string{"target.localhost"}, "target.localhost:" + port, false},
		{[]string{"127.0.0.1/32"}, "[::1]:" + port, false},
		{[]string{"169.254.0.0/16"}, "169.254.169.254:80", false},
	} {
		status, body := get(t, c.allow, c.dest)
		if c.ok && (status != 200 || !strings.HasPrefix(body, "reached ")) || !c.ok && status != http.StatusForbidden {
			t.Errorf("allow %v, %s: %d %q", c.allow, c.dest, status, body)
		}
	}
}

// The traces relay passes OTLP exports to the operator's collector with
// its credentials added outside the jail, and nothing else.
func TestTracesRelayForwardsExportsOnly(t *testing.T) {
	var got []string
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		got = append(got, req.Method+" "+req.URL.Path+" "+req.Header.Get("Api-Key")+" "+string(b))
	}))
	defer collector.Close()
	r := newRelay(t, egress.Config{TracesURL: collector.URL + "/otlp/v1/traces", TracesHeaders: http.Header{"Api-Key": {"collector-secret"}}})
	addr := listen(t, r, egress.KindTraces)
	for _, c := range []struct {
		method, path string
		status       int
	}{{"POST", "/v1/traces", 200}, {"GET", "/v1/traces", 404}, {"POST", "/v1/logs", 404}, {"POST", "/other", 404}} {
		req, _ := http.NewRequest(c.method, "http://"+addr+c.path, strings.NewReader("spans"))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, res.StatusCode, c.status)
		}
	}
	if len(got) != 1 || got[0] != "POST /otlp/v1/traces collector-secret spans" {
		t.Fatalf("the collector got %q", got)
	}
	// Without a collector the relay closes the connection.
	off := listen(t, newRelay(t, egress.Config{}), egress.KindTraces)
	if _, err := http.Post("http://"+off+"/v1/traces", "application/x-protobuf", strings.NewReader("x")); err == nil {
		t.Fatal("a relay without a collector answered")
	}
}
