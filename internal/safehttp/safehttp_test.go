package safehttp_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/safehttp"
)

func TestCheckAddr(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"8.8.8.8", true},
		{"1.1.1.1", true},
		{"2606:4700:4700::1111", true},
		{"127.0.0.1", false},
		{"127.1.2.3", false},
		{"::1", false},
		{"10.0.0.1", false},
		{"172.16.5.4", false},
		{"192.168.1.1", false},
		{"169.254.169.254", false},
		{"169.254.1.1", false},
		{"fe80::1", false},
		{"fc00::1", false},
		{"fd12:3456::1", false},
		{"0.0.0.0", false},
		{"::", false},
		{"::ffff:10.0.0.1", false},
		{"::ffff:127.0.0.1", false},
		{"100.64.0.1", false},
		{"224.0.0.1", false},
		{"ff02::1", false},
		{"255.255.255.255", false},
		{"64:ff9b::a00:1", false},
		// IPv4-compatible IPv6 (::/96): every one, whatever IPv4 it
		// embeds, private or public.
		{"::10.0.0.1", false},
		{"::127.0.0.1", false},
		{"::a9fe:a9fe", false},
		{"::192.168.1.1", false},
		{"::8.8.8.8", false},
		{"2002:a00:1::", false},
		{"192.0.2.10", false},
		{"198.18.0.1", false},
	} {
		err := safehttp.CheckAddr(netip.MustParseAddr(tc.addr), false)
		if (err == nil) != tc.ok {
			t.Errorf("CheckAddr(%s) = %v, want ok=%v", tc.addr, err, tc.ok)
		}
		if err != nil && !errors.Is(err, safehttp.ErrRefusedAddress) {
			t.Errorf("CheckAddr(%s): error %v does not wrap ErrRefusedAddress", tc.addr, err)
		}
	}
	// The test-only override admits loopback, and nothing else.
	if err := safehttp.CheckAddr(netip.MustParseAddr("127.0.0.1"), true); err != nil {
		t.Errorf("loopback with the override: %v", err)
	}
	if err := safehttp.CheckAddr(netip.MustParseAddr("10.0.0.1"), true); err == nil {
		t.Error("private address allowed by the loopback override")
	}
}

func tlsServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewTLSServer(h)
	t.Cleanup(s.Close)
	return s
}

func get(c *http.Client, url string) (string, error) {
	res, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return string(b), err
}

func TestFetch(t *testing.T) {
	t.Parallel()
	srv := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			io.WriteString(w, "hello")
		case "/to-http":
			http.Redirect(w, r, "http://"+r.Host+"/ok", http.StatusFound)
		case "/to-private":
			http.Redirect(w, r, "https://10.1.2.3/ok", http.StatusFound)
		case "/to-metadata":
			http.Redirect(w, r, "https://169.254.169.254/latest/meta-data", http.StatusFound)
		case "/to-ok":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/exact":
			io.WriteString(w, strings.Repeat("a", 1000))
		case "/big":
			w.Header().Set("Content-Length", "5000")
			io.WriteString(w, strings.Repeat("a", 5000))
		case "/big-chunked":
			for range 5 {
				io.WriteString(w, strings.Repeat("a", 1000))
				w.(http.Flusher).Flush()
			}
		case "/hang":
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}
	})
	good := safehttp.New(safehttp.Options{AllowLoopback: true, ExtraRoots: []*x509.Certificate{srv.Certificate()}, MaxBody: 1000, Timeout: 2 * time.Second})
	strict := safehttp.New(safehttp.Options{ExtraRoots: []*x509.Certificate{srv.Certificate()}})
	untrusted := safehttp.New(safehttp.Options{AllowLoopback: true})
	host := strings.TrimPrefix(srv.URL, "https://127.0.0.1")

	if body, err := get(good, srv.URL+"/ok"); err != nil || body != "hello" {
		t.Fatalf("plain fetch: %q, %v", body, err)
	}
	if body, err := get(good, srv.URL+"/to-ok"); err != nil || body != "hello" {
		t.Fatalf("https redirect on the same host: %q, %v", body, err)
	}
	if body, err := get(good, srv.URL+"/exact"); err != nil || len(body) != 1000 {
		t.Fatalf("body of exactly MaxBody: %d bytes, %v", len(body), err)
	}
	for _, tc := range []struct {
		name   string
		client *http.Client
		url    string
		want   error
	}{
		{"http scheme", good, "http://127.0.0.1" + host + "/ok", safehttp.ErrScheme},
		{"loopback without the override (literal)", strict, srv.URL + "/ok", safehttp.ErrRefusedAddress},
		{"loopback without the override (by name, refused at dial)", strict, "https://localhost" + host + "/ok", safehttp.ErrRefusedAddress},
		{"redirect to http", good, srv.URL + "/to-http", safehttp.ErrScheme},
		{"redirect to a private address", good, srv.URL + "/to-private", safehttp.ErrRefusedAddress},
		{"redirect to the metadata service", good, srv.URL + "/to-metadata", safehttp.ErrRefusedAddress},
		{"announced body past the cap", good, srv.URL + "/big", safehttp.ErrTooLarge},
		{"streamed body past the cap", good, srv.URL + "/big-chunked", safehttp.ErrTooLarge},
		{"private literal", good, "https://192.168.0.1/", safehttp.ErrRefusedAddress},
	} {
		_, err := get(tc.client, tc.url)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := get(good, srv.URL+"/loop"); err == nil || !strings.Contains(err.Error(), "redirects") {
		t.Errorf("redirect loop: %v", err)
	}
	if _, err := get(untrusted, srv.URL+"/ok"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("untrusted certificate: %v", err)
	}
	start := time.Now()
	if _, err := get(good, srv.URL+"/hang"); err == nil {
		t.Error("hanging server answered")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("hanging server held the client %v, want about the 2s timeout", d)
	}
}

func TestExtraRootsFromFile(t *testing.T) {
	t.Parallel()
	srv := tlsServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	dir := t.TempDir()
	path := filepath.Join(dir, "ca.pem")
	os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	certs, err := safehttp.ExtraRootsFromFile(path)
	if err != nil || len(certs) != 1 {
		t.Fatalf("ExtraRootsFromFile: %d certs, %v", len(certs), err)
	}
	c := safehttp.New(safehttp.Options{AllowLoopback: true, ExtraRoots: certs})
	if body, err := get(c, srv.URL); err != nil || body != "ok" {
		t.Fatalf("fetch with the file's root: %q, %v", body, err)
	}
	if certs, err := safehttp.ExtraRootsFromFile(""); err != nil || certs != nil {
		t.Fatalf("empty path: %v, %v", certs, err)
	}
	bad := filepath.Join(dir, "bad.pem")
	os.WriteFile(bad, []byte("not a certificate"), 0o600)
	if _, err := safehttp.ExtraRootsFromFile(bad); err == nil {
		t.Fatal("a file without certificates accepted")
	}
	if _, err := safehttp.ExtraRootsFromFile(filepath.Join(dir, "missing.pem")); err == nil {
		t.Fatal("a missing file accepted")
	}
}

// An operator's allowlist opens the listed non-public destinations (an
// identity provider on the private network) and nothing else: not a
// redirect to an unlisted address, not loopback by hostname, never the
// metadata address.
func TestAllowlist(t *testing.T) {
	t.Parallel()
	var srv *httptest.Server
	srv = tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			io.WriteString(w, "hello")
		case "/to-unlisted":
			http.Redirect(w, r, "https://127.0.0.2"+strings.TrimPrefix(srv.URL, "https://127.0.0.1")+"/ok", http.StatusFound)
		}
	})
	client := func(entries ...string) *http.Client {
		a, err := safehttp.ParseAllowlist(entries)
		if err != nil {
			t.Fatal(err)
		}
		return safehttp.New(safehttp.Options{ExtraRoots: []*x509.Certificate{srv.Certificate()}, Allow: a, Timeout: 2 * time.Second})
	}
	if _, err := get(client(), srv.URL+"/ok"); !errors.Is(err, safehttp.ErrRefusedAddress) {
		t.Fatalf("unlisted loopback issuer: %v", err)
	}
	if body, err := get(client("127.0.0.1/32"), srv.URL+"/ok"); err != nil || body != "hello" {
		t.Fatalf("listed range: %q %v", body, err)
	}
	if body, err := get(client("127.0.0.1"), srv.URL+"/ok"); err != nil || body != "hello" {
		t.Fatalf("listed address: %q %v", body, err)
	}
	if _, err := get(client("127.0.0.1/32"), srv.URL+"/to-unlisted"); !errors.Is(err, safehttp.ErrRefusedAddress) {
		t.Fatalf("redirect to an unlisted address: %v", err)
	}
	port := strings.TrimPrefix(srv.URL, "https://127.0.0.1")
	if _, err := get(client("localhost"), "https://localhost"+port+"/ok"); !errors.Is(err, safehttp.ErrRefusedAddress) {
		t.Fatalf("loopback through a listed hostname: %v", err)
	}
	if _, err := get(client("169.254.0.0/16", "169.254.169.254"), "https://169.254.169.254/latest/meta-data"); !errors.Is(err, safehttp.ErrRefusedAddress) {
		t.Fatalf("metadata address: %v", err)
	}
	for _, bad := range []string{"10.0.0.0/33", "a b", "keycloak:8443", "https://idp"} {
		if _, err := safehttp.ParseAllowlist([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// CheckURL, used when an issuer is saved, refuses what the dial would
// refuse, with the same allowlist.
func TestCheckURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	allow, err := safehttp.ParseAllowlist([]string{"10.0.0.0/8", "127.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	c := safehttp.New(safehttp.Options{Allow: allow})
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"https://127.0.0.1:8443/", false},
		{"https://localhost/", false}, // resolved now, as the dial would
		{"https://192.168.1.5/jwks", false},
		{"https://169.254.169.254/", false},
		{"https://10.1.2.3/", true},
		{"https://127.0.0.2/", true},
		{"https://8.8.8.8/", true},
		{"https://no-such-host.invalid/", true}, // unresolvable: the fetch will say
	} {
		err := safehttp.CheckURL(ctx, c, tc.url)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, safehttp.ErrRefusedAddress)) {
			t.Errorf("%s: got %v, want ok=%v", tc.url, err, tc.ok)
		}
	}
	// A client that is not guarded (or one allowing loopback, for tests)
	// is not second-guessed.
	if err := safehttp.CheckURL(ctx, http.DefaultClient, "https://127.0.0.1/"); err != nil {
		t.Error(err)
	}
	if err := safehttp.CheckURL(ctx, safehttp.New(safehttp.Options{AllowLoopback: true}), "https://127.0.0.1/"); err != nil {
		t.Error(err)
	}
}
