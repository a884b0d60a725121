package e2e_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
)

// proxyTarget is an HTTPS server on loopback for two test names,
// target.localhost (a secret is bound to it) and other.localhost (none
// is), and for 127.0.0.1, with a certificate of its own CA. It records
// every request's host and credentials, echoes them back, redirects, and
// serves a git repository through `git http-backend` to whoever presents
// the token as Basic password.
type proxyTarget struct {
	srv    *http.Server
	port   string
	CAFile string
	token  string
	repo   string // the bare repository's path
	mu     sync.Mutex
	seen   []string // "host auth x-a x-b path?query"
}

func startProxyTarget(t *testing.T, token string) *proxyTarget {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "proxy target"},
		DNSNames: []string{"target.localhost", "other.localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxyTarget{CAFile: filepath.Join(t.TempDir(), "ca.pem"), token: token}
	os.WriteFile(p.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)

	// A bare repository with one commit.
	root := t.TempDir()
	work := filepath.Join(root, "work")
	for _, args := range [][]string{{"init", "-q", "-b", "main", work}, {"-C", work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "vault-proxy-commit"},
		{"clone", "-q", "--bare", work, filepath.Join(root, "repo.git")}, {"-C", filepath.Join(root, "repo.git"), "config", "http.receivepack", "true"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	p.repo = filepath.Join(root, "repo.git")
	git, _ := exec.LookPath("git")
	backend := &cgi.Handler{Path: git, Args: []string{"http-backend"}, Dir: root, InheritEnv: []string{"PATH"},
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	mux := http.NewServeMux()
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://other.localhost:"+p.port+"/echo", http.StatusFound)
	})
	mux.HandleFunc("/repo.git/", func(w http.ResponseWriter, r *http.Request) {
		if _, pw, ok := r.BasicAuth(); !ok || pw != token {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	})
	// A one-package npm registry that wants the token as a Bearer.
	tgz := npmTarball(t)
	mux.HandleFunc("/npm/", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		base := "https://target.localhost:" + p.port + "/npm/"
		switch r.URL.Path {
		case "/npm/vp-pkg":
			sha1sum, sha512sum := sha1.Sum(tgz), sha512.Sum512(tgz)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"name":"vp-pkg","dist-tags":{"latest":"1.0.0"},"versions":{"1.0.0":{"name":"vp-pkg","version":"1.0.0","dist":{"tarball":"%svp-pkg/-/vp-pkg-1.0.0.tgz","shasum":"%s","integrity":"sha512-%s"}}}}`,
				base, hex.EncodeToString(sha1sum[:]), base64.StdEncoding.EncodeToString(sha512sum[:]))
		case "/npm/vp-pkg/-/vp-pkg-1.0.0.tgz":
			w.Write(tgz)
		default:
			http.NotFound(w, r)
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// The echo: what a server that reflects its request sends back.
		fmt.Fprintf(w, "host=%s auth=[%s] path=[%s] query=[%s]\n", r.Host, r.Header.Get("Authorization"), r.URL.Path, r.URL.RawQuery)
	})
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.seen = append(p.seen, strings.Join([]string{r.Host, r.Header.Get("Authorization"), r.Header.Get("X-A"), r.Header.Get("X-B"), r.URL.RequestURI()}, " "))
		p.mu.Unlock()
		mux.ServeHTTP(w, r)
	}), ErrorLog: log.New(io.Discard, "", 0), TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	go p.srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { p.srv.Close() })
	return p
}

// npmTarball is the package vp-pkg 1.0.0, as npm pack makes it.
func npmTarball(t *testing.T) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range map[string]string{"package/package.json": `{"name":"vp-pkg","version":"1.0.0","main":"index.js"}`,
		"package/index.js": "module.exports = 'npm-proxy-ok';\n"} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(1700000000, 0)})
		tw.Write([]byte(body))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	return buf.Bytes()
}

// take returns and forgets what the server has seen.
func (p *proxyTarget) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.seen
	p.seen = nil
	return s
}

// TestVaultProxy: a jailed intern's programs (curl, git) use a vault
// secret through the egress proxy by its placeholder; the bound host gets
// the value, nothing in the jail sees it, and tricks release nothing
// (ADR 0931).
func TestVaultProxy(t *testing.T) {
	t.Parallel()
	token := randomCanary("proxy-token")
	elsewhere := randomCanary("elsewhere")
	tg := startProxyTarget(t, token)
	c := &cluster{dataDir: t.TempDir()}
	c.dbArgs = []string{"--data-dir", c.dataDir}
	gw := c.Gateway(t, "--provisioner", "local", "--log-level", "info",
		"--intern-egress-allow-hosts", "127.0.0.1/32", "--http-tool-ca-file", tg.CAFile)
	c.load(t)
	a := &agentGateway{gw: gw, c: c, intern: c.Demo}
	a.putSecret(t, "tok", "target.localhost", token)
	a.putSecret(t, "elsewhere", "third.localhost", elsewhere)
	waitTurn(t, gw, c.WK, c.Demo)
	target, other := "https://target.localhost:"+tg.port, "https://other.localhost:"+tg.port
	// (A jail's NO_PROXY names localhost, whose subdomains curl and git
	// take for it too: the test's hosts are under .localhost.)
	run := func(t *testing.T, command string) string {
		t.Helper()
		s := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ export NO_PROXY= no_proxy=; "+command+"; echo done-$((40+2))", `"approval_mode":"self-drive"`)))
		if !strings.Contains(s.Text, "done-42") {
			t.Fatalf("the command did not run to its end: %q %q", s.Finish, s.Text)
		}
		if strings.Contains(s.Text, token) || strings.Contains(s.Text, elsewhere) {
			t.Fatalf("the jail saw a secret's value: %q", s.Text)
		}
		return s.Text
	}
	basic := func(user, pw string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pw)) }
	// The server's CA beside the jail's bundle, for the tunnelled hosts.
	all := "/tmp/all-ca.pem"
	run(t, "cat $SSL_CERT_FILE /run/cohort/http-tool-ca.pem > "+all)
	tg.take()

	t.Run("curl -u and a bearer header reach the bound host with the value; the echo is redacted", func(t *testing.T) {
		out := run(t, "curl -sS -u 'x:{{secret:tok}}' "+target+"/echo 2>&1; curl -sS -H 'Authorization: Bearer {{secret:tok}}' '"+target+"/p?k=%7B%7Bsecret:tok%7D%7D' 2>&1; "+
			// Without the variables: the jail's system bundle holds the CA too.
			"env -u SSL_CERT_FILE -u CURL_CA_BUNDLE curl -sS -H 'Authorization: Bearer {{secret:tok}}' "+target+"/system-bundle 2>&1")
		seen := tg.take()
		if len(seen) != 3 || !strings.Contains(seen[2], "Bearer "+token) || !strings.Contains(seen[0], basic("x", token)) || !strings.Contains(seen[1], "Bearer "+token) || !strings.Contains(seen[1], "k="+token) {
			t.Fatalf("the server saw %q", seen)
		}
		if !strings.Contains(out, "auth=[Basic ") || !strings.Contains(out, "auth=[Bearer {{secret:tok}}]") || !strings.Contains(out, "query=[k={{secret:tok}}]") {
			t.Fatalf("the command printed %q", out)
		}
	})

	t.Run("git clone and push over HTTPS with the placeholder in the URL", func(t *testing.T) {
		out := run(t, "rm -rf /tmp/clone; git clone -q https://x:{{secret:tok}}@target.localhost:"+tg.port+"/repo.git /tmp/clone 2>&1; git -C /tmp/clone log --format=%s 2>&1; cat /tmp/clone/.git/config; "+
			"git -C /tmp/clone -c user.name=i -c user.email=i@i commit -q --allow-empty -m pushed-by-intern 2>&1 && git -C /tmp/clone push -q origin HEAD:main 2>&1")
		if !strings.Contains(out, "vault-proxy-commit") || !strings.Contains(out, "x:{{secret:tok}}@target.localhost") {
			t.Fatalf("the clone failed: %q", out)
		}
		if log, err := exec.Command("git", "-C", tg.repo, "log", "--format=%s", "main").CombinedOutput(); err != nil || !strings.Contains(string(log), "pushed-by-intern") {
			t.Fatalf("the push did not arrive: %v %s (the command printed %q)", err, log, out)
		}
		if seen := tg.take(); !strings.Contains(strings.Join(seen, "\n"), basic("x", token)) {
			t.Fatalf("the git server saw %q", seen)
		}
	})

	t.Run("npm install from a registry with the token in .npmrc", func(t *testing.T) {
		reg := "target.localhost:" + tg.port + "/npm/"
		out := run(t, "rm -rf /tmp/np && mkdir -p /tmp/np && cd /tmp/np && printf 'registry=https://"+reg+"\\n//"+reg+":_authToken={{secret:tok}}\\n' > .npmrc && "+
			"timeout 45 npm install --no-audit --no-fund --no-update-notifier --loglevel http vp-pkg 2>&1 | tail -15; cat node_modules/vp-pkg/index.js; cat .npmrc")
		if !strings.Contains(out, "npm-proxy-ok") || !strings.Contains(out, "_authToken={{secret:tok}}") {
			t.Fatalf("npm install: %q; the registry saw %q", out, tg.take())
		}
		if seen := strings.Join(tg.take(), "\n"); !strings.Contains(seen, "Bearer "+token) {
			t.Fatalf("the registry saw %q", seen)
		}
	})

	t.Run("tricks release nothing", func(t *testing.T) {
		cases := []struct{ name, command, want string }{
			{"a host with no bound secret gets the placeholder", "curl -sS --cacert " + all + " -H 'Authorization: Bearer {{secret:tok}}' " + other + "/echo", "Bearer {{secret:tok}}"},
			{"a secret bound elsewhere is sent as written", "curl -sS -H 'Authorization: Bearer {{secret:elsewhere}}' " + target + "/echo", "Bearer {{secret:elsewhere}}"},
			{"CONNECT to an IP literal", "curl -sS --cacert " + all + " -H 'Authorization: Bearer {{secret:tok}}' https://127.0.0.1:" + tg.port + "/echo", "Bearer {{secret:tok}}"},
			{"a placeholder split across headers", "curl -sS -H 'X-A: {{secret:' -H 'X-B: tok}}' " + target + "/echo", "{{secret: tok}}"},
			{"a redirect to another host", "curl -sS -L --location-trusted --cacert " + all + " -u 'x:{{secret:tok}}' " + target + "/redirect", basic("x", "{{secret:tok}}")},
		}
		for _, tc := range cases {
			run(t, tc.command+" 2>&1")
			seen := strings.Join(tg.take(), "\n")
			if strings.Contains(seen, token) && tc.name != "a redirect to another host" || !strings.Contains(seen, tc.want) {
				t.Errorf("%s: the server saw %q", tc.name, seen)
			}
			if tc.name == "a redirect to another host" {
				// The bound host got the value; the other host only the placeholder.
				for _, l := range strings.Split(seen, "\n") {
					if strings.HasPrefix(l, "other.localhost") && strings.Contains(l, basic("x", token)) {
						t.Errorf("the redirect carried the value to %q", l)
					}
				}
			}
		}
		out := run(t, "curl -sS -H 'Host: other.localhost:"+tg.port+"' -H 'Authorization: Bearer {{secret:tok}}' "+target+"/echo 2>&1")
		if seen := tg.take(); len(seen) != 0 || !strings.Contains(out, "not other.localhost") {
			t.Errorf("a Host header for another host: the server saw %q, the command printed %q", seen, out)
		}
	})

	t.Run("manual mode: the approved command's releases, none for the sandboxed or the rejected", func(t *testing.T) {
		cmd := "export NO_PROXY= no_proxy=; curl -sS -H 'Authorization: Bearer {{secret:tok}}' " + target + "/manual 2>&1; echo ran-$((40+2))"
		ask := func() *stream {
			s := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ "+cmd, `"approval_mode":"manual"`)))
			// The caller approves what it sees: the placeholder, never a value.
			if in, _ := s.Args["input"].(string); s.Finish != "tool_calls" || !strings.Contains(in, "{{secret:tok}}") {
				t.Fatalf("pause %q %v", s.Finish, s.Args)
			}
			return s
		}
		for _, c2 := range []struct {
			answer string
			ran    bool // the command ran
			seen   bool // the host got the value
		}{{"reject_once", false, false}, {"allow_once", true, false}, {"allow_always", true, true}} {
			s := ask()
			r := readAll(t, chat(t, gw, c.WK, c.Demo, s.answer(c2.answer)))
			if strings.Contains(r.Text, token) || strings.Contains(r.Text, "ran-42") != c2.ran {
				t.Fatalf("%s: %q", c2.answer, r.Text)
			}
			seen := tg.take()
			if got := slices.ContainsFunc(seen, func(l string) bool { return strings.Contains(l, "Bearer "+token) }); got != c2.seen || len(seen) > 1 {
				t.Fatalf("%s: the host saw %q", c2.answer, seen)
			}
		}
	})

	t.Run("the audit lists the releases and the refusal; the CA key is nowhere in the jail", func(t *testing.T) {
		audit, err := c.admin("vault", "audit", "--org", c.Org, "--json")
		if err != nil {
			t.Fatal(err)
		}
		s := string(audit)
		if strings.Count(s, `"egress-proxy"`) < 4 || !strings.Contains(s, `"host_not_allowed"`) || strings.Contains(s, token) {
			t.Fatalf("audit %s", s)
		}
		out := run(t, "grep -rl 'PRIVATE KEY' /run /intern /tmp /etc 2>/dev/null | head; env | grep -c CA_BUNDLE")
		if strings.Contains(out, "/") {
			t.Fatalf("a private key in the jail: %q", out)
		}
	})
}

// TestVaultProxyAgentShells: each installed third-party agent's own shell
// tool runs curl with a placeholder in self-drive; the bound host gets the
// value, the agent's turn shows none (ADR 0931).
func TestVaultProxyAgentShells(t *testing.T) {
	for _, p := range agents.All() {
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			a := newAgentGateway(t, p)
			s := a.turn(t, "cohort-run: export NO_PROXY= no_proxy=; curl -sS -H 'Authorization: Bearer {{secret:target_token}}' https://"+a.target.Host+"/shell && echo shell-4''2",
				`"approval_mode":"self-drive"`)
			if !strings.Contains(s.Text, "shell-42") || strings.Contains(s.Text, a.secret) {
				t.Fatalf("finish %q text %q error %v", s.Finish, s.Text, s.Error)
			}
			if !slices.Contains(a.target.Auth(), "Bearer "+a.secret) {
				t.Fatalf("the host saw %q", a.target.Auth())
			}
		})
	}
}
