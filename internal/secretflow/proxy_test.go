package secretflow_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/vault"
)

// The egress proxy's door to the vault (ADR 0931), against the real vault
// and database: a relay whose internet proxy intercepts hosts with a bound
// secret, a loopback TLS host standing in for them under .localhost names.

const proxyToken = "ghp-proxy-door-canary-0123456789abcdef"

type proxyRig struct {
	e       *testenv.Env
	relay   *egress.Relay
	ca      *vault.ProxyCA
	addr    string // the internet relay's listener
	up      *httptest.Server
	port    string
	roots   *x509.CertPool // the jail's: the proxy CA (and, for tunnels, the host's own)
	host    *x509.Certificate
	mu      sync.Mutex
	seen    []string
	payload []byte
}

func newProxyRig(t testing.TB, db *bun.DB) *proxyRig {
	t.Helper()
	r := &proxyRig{e: testenv.New(t, db), payload: make([]byte, 1<<20)}
	ctx := context.Background()
	// The host: a certificate of its own for the test names.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(3), DNSNames: []string{"api.localhost", "other.localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, Subject: pkix.Name{CommonName: "host"}}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	hostCert, _ := x509.ParseCertificate(der)
	r.host = hostCert
	r.up = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.seen = append(r.seen, req.Host+" "+req.Header.Get("Authorization")+" "+req.URL.RequestURI())
		r.mu.Unlock()
		switch req.URL.Path {
		case "/ws":
			// A WebSocket-like upgrade that echoes the credential in its
			// raw stream.
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nraw " + req.Header.Get("Authorization") + "\n")
			brw.Flush()
			return
		case "/mib":
			w.Write(r.payload)
		case "/gzip":
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			fmt.Fprintf(zw, "you sent %s", req.Header.Get("Authorization"))
			zw.Close()
		default:
			w.Header().Set("X-Echo", req.Header.Get("Authorization"))
			fmt.Fprintf(w, "you sent %s at %s", req.Header.Get("Authorization"), req.URL.RequestURI())
		}
	}))
	r.up.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	r.up.StartTLS()
	t.Cleanup(r.up.Close)
	r.port = r.up.Listener.Addr().(*net.TCPAddr).AddrPort().String()
	r.port = r.port[strings.LastIndexByte(r.port, ':')+1:]

	var err error
	if r.ca, err = vault.LoadProxyCA(ctx, r.e.DB, r.e.Server.KEK, nil); err != nil {
		t.Fatal(err)
	}
	r.relay, err = egress.New(egress.Config{Internet: true, AllowLoopback: true, UpstreamRoots: []*x509.Certificate{hostCert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.relay.Close() })
	r.relay.SetSecrets(vault.ProxyDoor{S: r.e.Server.Vault, CA: r.ca})
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
			go r.relay.Serve(r.e.InternID, egress.KindInternet, c)
		}
	}()
	r.addr = ln.Addr().String()
	r.roots = x509.NewCertPool()
	r.roots.AppendCertsFromPEM([]byte(r.ca.CertPEM()))
	r.roots.AddCert(hostCert)
	r.put(t, "gh", proxyToken, "api.localhost")
	r.put(t, "elsewhere", "elsewhere-canary-value-42", "third.localhost")
	return r
}

func (r *proxyRig) put(t testing.TB, name, value, host string) {
	t.Helper()
	v, _ := json.Marshal(map[string]any{"hosts": []string{host}, "value": value})
	if st, body, _ := r.e.Do(t, "PUT", "/vault/interns/"+r.e.InternID+"/secrets/"+name, r.e.WorkspaceKey, "application/json", string(v)); st != 201 {
		t.Fatal(st, body)
	}
}

func (r *proxyRig) client() *http.Client {
	u, _ := url.Parse("http://" + r.addr)
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(u),
		TLSClientConfig: &tls.Config{RootCAs: r.roots}, DisableCompression: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (r *proxyRig) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.seen
	r.seen = nil
	return s
}

func (r *proxyRig) get(t testing.TB, rawURL string, h map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", rawURL, nil)
	for k, v := range h {
		if k == "Host" {
			req.Host = v
		}
		req.Header.Set(k, v)
	}
	res, err := r.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

// releases are the audit's rows of the egress proxy.
func (r *proxyRig) releases(t testing.TB) []store.VaultRelease {
	var rows []store.VaultRelease
	if err := r.e.DB.NewSelect().Model(&rows).Where("actor = ?", vault.ProxyActor).Order("created_at").Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	return rows
}

func TestProxyDoor(t *testing.T) {
	for _, st := range []struct {
		name string
		open func(testing.TB) *bun.DB
	}{{"sqlite", storetest.SQLite}, {"postgres", storetest.Postgres}} {
		t.Run(st.name, func(t *testing.T) {
			r := newProxyRig(t, st.open(t))
			base := "https://api.localhost:" + r.port

			// Header, path and query: the host sees the value, the client
			// the placeholder, in the echoed header and body.
			res, body := r.get(t, base+"/repos/%7B%7Bsecret:gh%7D%7D?token={{secret:gh}}", map[string]string{"Authorization": "token {{secret:gh}}"})
			seen := r.take()
			if len(seen) != 1 || seen[0] != "api.localhost:"+r.port+" token "+proxyToken+" /repos/"+proxyToken+"?token="+proxyToken {
				t.Fatalf("the host saw %q", seen)
			}
			if strings.Contains(body, proxyToken) || res.Header.Get("X-Echo") != "token {{secret:gh}}" || !strings.Contains(body, "you sent token {{secret:gh}}") {
				t.Fatalf("the client got %v %q", res.Header, body)
			}
			// Basic credentials, and their encoded echo.
			req, _ := http.NewRequest("GET", base+"/basic", nil)
			req.SetBasicAuth("x", "{{secret:gh}}")
			placeholderBasic := req.Header.Get("Authorization")
			res, err := r.client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			want := &http.Request{Header: http.Header{}}
			want.SetBasicAuth("x", proxyToken)
			if seen := r.take(); len(seen) != 1 || !strings.Contains(seen[0], want.Header.Get("Authorization")) {
				t.Fatalf("Basic: the host saw %q", seen)
			}
			if strings.Contains(string(b), want.Header.Get("Authorization")) || !strings.Contains(string(b), placeholderBasic) {
				t.Fatalf("Basic: the client got %q", b)
			}
			// A gzip answer is decoded and redacted.
			if _, body := r.get(t, base+"/gzip", map[string]string{"Authorization": "Bearer {{secret:gh}}", "Accept-Encoding": "gzip"}); body != "you sent Bearer {{secret:gh}}" {
				t.Fatalf("gzip: %q", body)
			}
			r.take()
			// A secret bound to another host is sent as written, refused in the audit.
			if _, body := r.get(t, base+"/x", map[string]string{"Authorization": "Bearer {{secret:elsewhere}}"}); !strings.Contains(body, "Bearer {{secret:elsewhere}}") {
				t.Fatalf("elsewhere: %q", body)
			}
			// A host with no bound secret is tunnelled: its own certificate,
			// the placeholder as written.
			res, body = r.get(t, "https://other.localhost:"+r.port+"/x", map[string]string{"Authorization": "Bearer {{secret:gh}}"})
			if res.TLS == nil || res.TLS.PeerCertificates[0].Subject.CommonName != "host" || !strings.Contains(body, "Bearer {{secret:gh}}") {
				t.Fatalf("unbound host: %q", body)
			}
			if seen := r.take(); slices.ContainsFunc(seen, func(s string) bool { return strings.Contains(s, proxyToken) }) {
				t.Fatalf("released to the wrong host: %q", seen)
			}
			// The Host header must name the CONNECT's host.
			if res, _ := r.get(t, base+"/x", map[string]string{"Authorization": "Bearer {{secret:gh}}", "Host": "other.localhost"}); res.StatusCode != http.StatusMisdirectedRequest || len(r.take()) != 0 {
				t.Fatalf("Host mismatch: %d", res.StatusCode)
			}
			// A ClientHello naming another server than the CONNECT's host.
			c := rawConnect(t, r.addr, "api.localhost:"+r.port)
			tc := tls.Client(c, &tls.Config{ServerName: "other.localhost", RootCAs: r.roots})
			if err := tc.Handshake(); err == nil {
				t.Fatal("a ClientHello for another host was answered")
			}
			c.Close()

			// An upgrade after a release is refused: its raw stream would
			// pass unredacted. Without a release it is relayed.
			for _, auth := range []string{"Bearer {{secret:gh}}", "Bearer none"} {
				c := rawConnect(t, r.addr, "api.localhost:"+r.port)
				tc := tls.Client(c, &tls.Config{ServerName: "api.localhost", RootCAs: r.roots})
				fmt.Fprintf(tc, "GET /ws HTTP/1.1\r\nHost: api.localhost:%s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nAuthorization: %s\r\n\r\n", r.port, auth)
				tc.SetReadDeadline(time.Now().Add(10 * time.Second))
				res, err := http.ReadResponse(bufio.NewReader(tc), nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
				c.Close()
				if strings.Contains(string(b), proxyToken) || (auth == "Bearer none") != (res.StatusCode == http.StatusSwitchingProtocols) {
					t.Fatalf("upgrade with %q: %d %q", auth, res.StatusCode, b)
				}
			}
			r.take()

			rows := r.releases(t)
			var got []string
			for _, row := range rows {
				got = append(got, row.SecretName+"@"+row.Host+"="+row.Outcome)
			}
			if want := []string{"gh@api.localhost=released", "gh@api.localhost=released", "gh@api.localhost=released", "elsewhere@api.localhost=refused", "gh@api.localhost=released"}; !slices.Equal(got, want) {
				t.Fatalf("audit %q, want %q", got, want)
			}
		})
	}
}

// TestRemoteProxyDoor: a remote `cohort intern --jail`'s relay, with its
// own in-memory CA, asks the gateway (InternGatewayService, the daemon's
// credential) whether a host is bound and for each value: the gateway's
// rule and audit; with a wrong credential it intercepts nothing.
func TestRemoteProxyDoor(t *testing.T) {
	r := newProxyRig(t, storetest.SQLite(t))
	ctx := context.Background()
	const secret = "remote-daemon-secret"
	ct, _ := r.e.Server.KEK.Wrap([]byte(secret), []byte("cohort/intern-daemon-secret/"+r.e.InternID))
	if _, err := r.e.DB.NewUpdate().Model((*store.Intern)(nil)).Set("daemon_secret = ?", base64.StdEncoding.EncodeToString(ct)).Where("id = ?", r.e.InternID).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	ca, err := vault.NewEphemeralProxyCA()
	if err != nil {
		t.Fatal(err)
	}
	// The jail trusts this process's CA, not the gateway's.
	r.roots = x509.NewCertPool()
	r.roots.AppendCertsFromPEM([]byte(ca.CertPEM()))
	r.roots.AddCert(r.host)
	door := func(credential string) vault.RemoteProxyDoor {
		cl := &http.Client{Transport: roundTripper(func(req *http.Request) (*http.Response, error) {
			req = req.Clone(req.Context())
			req.Header.Set("Authorization", "Bearer "+credential)
			return r.e.HTTPClient().Transport.RoundTrip(req)
		})}
		return vault.RemoteProxyDoor{Gateway: cohortv1connect.NewInternGatewayServiceClient(cl, r.e.URL), InternID: r.e.InternID, CA: ca}
	}
	base := "https://api.localhost:" + r.port

	r.relay.SetSecrets(door(launch.DaemonCredential(secret)))
	if _, body := r.get(t, base+"/x", map[string]string{"Authorization": "Bearer {{secret:gh}}"}); body != "you sent Bearer {{secret:gh}} at /x" {
		t.Fatalf("the client got %q", body)
	}
	if seen := r.take(); len(seen) != 1 || !strings.Contains(seen[0], "Bearer "+proxyToken) {
		t.Fatalf("the host saw %q", seen)
	}
	var rows []store.VaultRelease
	r.e.DB.NewSelect().Model(&rows).Where("intern_id = ?", r.e.InternID).Scan(ctx)
	if len(rows) != 1 || rows[0].Outcome != vault.OutcomeReleased || rows[0].Actor != "daemon:"+r.e.InternID || rows[0].Host != "api.localhost" {
		t.Fatalf("audit %+v", rows)
	}

	// A wrong credential is refused: the relay tunnels, and the client meets the host's own
	// certificate with the placeholder.
	r.relay.SetSecrets(door("not-the-credential"))
	res, body := r.get(t, base+"/x", map[string]string{"Authorization": "Bearer {{secret:gh}}"})
	if res.TLS.PeerCertificates[0].Subject.CommonName != "host" || !strings.Contains(body, "{{secret:gh}}") {
		t.Fatalf("with a wrong credential: %q", body)
	}
	if seen := r.take(); len(seen) != 1 || strings.Contains(seen[0], proxyToken) {
		t.Fatalf("the host saw %q", seen)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// rawConnect opens a CONNECT tunnel through the relay at addr.
func rawConnect(t testing.TB, addr, dest string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", res, err)
	}
	return c
}

// TestProxyCAKeyStaysWrapped: the database holds the CA key only wrapped,
// another gateway (replica) loads the same CA, and one with another KEK
// cannot open it.
func TestProxyCAKeyStaysWrapped(t *testing.T) {
	e := testenv.New(t, storetest.SQLite(t))
	ctx := context.Background()
	a, err := vault.LoadProxyCA(ctx, e.DB, e.Server.KEK, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := vault.LoadProxyCA(ctx, e.DB, e.Server.KEK, nil)
	if err != nil || b.CertPEM() != a.CertPEM() {
		t.Fatalf("a second load made another CA: %v", err)
	}
	var row store.ProxyCA
	if err := e.DB.NewSelect().Model(&row).Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(row.CertPEM, "PRIVATE") || len(row.WrappedKey) == 0 {
		t.Fatal("the row holds the key unwrapped")
	}
	other := testenv.New(t, storetest.SQLite(t))
	if _, err := other.DB.NewInsert().Model(&row).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := vault.LoadProxyCA(ctx, other.DB, other.Server.KEK, nil); err == nil {
		t.Fatal("another KEK opened the CA's key")
	}
	leaf, err := a.Certificate("api.localhost")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(a.CertPEM()))
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.localhost", Roots: pool}); err != nil {
		t.Fatal(err)
	}
	if life := time.Until(leaf.Leaf.NotAfter); life > vault.LeafLife {
		t.Fatalf("the leaf lives %v", life)
	}
}

// BenchmarkProxyDoor is what the interception adds beside the plain
// tunnel: one small GET per operation on a kept-alive connection
// ("request"), and a 1 MiB answer per operation ("mib"), through the
// plain tunnel (a host with no bound secret), intercepted without a
// placeholder, and intercepted with one release (audited, so a database
// write). cpu-ms/MiB is the process's CPU time (client, relay and host in
// one process) per MiB of answer.
func BenchmarkProxyDoor(b *testing.B) {
	r := newProxyRig(b, storetest.SQLite(b))
	for _, c := range []struct {
		name, host, auth string
	}{{"tunnel", "other.localhost", ""}, {"intercepted", "api.localhost", ""}, {"released", "api.localhost", "Bearer {{secret:gh}}"}} {
		for _, kind := range []string{"request", "mib"} {
			b.Run(c.name+"/"+kind, func(b *testing.B) {
				cl := r.client()
				path := "/small"
				if kind == "mib" {
					path = "/mib"
					b.SetBytes(1 << 20)
				}
				req, _ := http.NewRequest("GET", "https://"+c.host+":"+r.port+path, nil)
				if c.auth != "" {
					req.Header.Set("Authorization", c.auth)
				}
				do := func() {
					res, err := cl.Do(req)
					if err != nil || res.StatusCode != 200 {
						b.Fatal(res, err)
					}
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
				do() // the connection, and its handshakes
				r.take()
				cpu0 := cpuTime()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					do()
				}
				b.StopTimer()
				if kind == "mib" {
					b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/MiB")
				}
				r.take()
			})
		}
	}
}

// BenchmarkProxyDoorConnect is what deciding costs a CONNECT to a host
// with no bound secret: a new tunnel per operation (CONNECT, TLS, one
// GET), with the door (the vault asked: the intern, its secrets' hosts)
// and without.
func BenchmarkProxyDoorConnect(b *testing.B) {
	r := newProxyRig(b, storetest.SQLite(b))
	door := vault.ProxyDoor{S: r.e.Server.Vault, CA: r.ca}
	for _, c := range []struct {
		name string
		s    egress.Secrets
	}{{"without-door", nil}, {"with-door", door}} {
		b.Run(c.name, func(b *testing.B) {
			r.relay.SetSecrets(c.s)
			defer r.relay.SetSecrets(door)
			u, _ := url.Parse("http://" + r.addr)
			cl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{RootCAs: r.roots}, DisableKeepAlives: true}}
			for i := 0; i < b.N; i++ {
				res, err := cl.Get("https://other.localhost:" + r.port + "/small")
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
			r.take()
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
