package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/cohort-dev/cohort/internal/httptool"
	"github.com/cohort-dev/cohort/internal/vaulthost"
)

// The vault's second door (ADR 0931): a CONNECT to a host that one of the
// intern's secrets is bound to is not tunnelled but terminated here, with
// a certificate for that host from the gateway's CA, which the jail
// trusts. Each request inside has its {{secret:NAME}} placeholders (header
// values, Basic credentials, path, query) replaced by the values the vault
// releases for that host, by the same rule and audit as the http_request
// tool, and goes on to the real host over verified TLS; its response comes
// back with every released value replaced by its placeholder again.

// Secrets is what the internet relay asks the vault; nil intercepts
// nothing.
type Secrets interface {
	// Bound says whether intern's vault, or its workspace's, holds a
	// secret bound to host (a normalized DNS name): only then is a
	// CONNECT to it intercepted.
	Bound(ctx context.Context, intern, host string) (bool, error)
	// Release is the vault's release (one rule, audited) of secret name
	// for one request of intern's to host.
	Release(ctx context.Context, intern, name, host string) (string, error)
	// Certificate is a short-lived leaf for host signed by the CA the
	// jails trust; its key never leaves the gateway.
	Certificate(host string) (*tls.Certificate, error)
}

// SetSecrets makes the internet relay intercept CONNECTs to hosts with a
// bound secret (s nil: none).
func (r *Relay) SetSecrets(s Secrets) {
	r.secrets.Store(&s)
}

func (r *Relay) secretsDoor() Secrets {
	if p := r.secrets.Load(); p != nil {
		return *p
	}
	return nil
}

// interceptHost is the host of a CONNECT target that may be intercepted:
// a DNS name (never an IP literal, never anything the vault would not
// store as a host) with a bound secret; "" tunnels.
func (r *Relay) interceptHost(ctx context.Context, intern, target string) string {
	s := r.secretsDoor()
	if s == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	norm, err := vaulthost.NormalizeHost(host)
	if err != nil {
		return ""
	}
	ok, err := s.Bound(ctx, intern, norm)
	if err != nil {
		// Without an answer, the tunnel: nothing is released through it.
		r.log.Warn("internet relay: vault bindings unavailable, tunnelling", "dest", target, "err", err)
		return ""
	}
	if !ok {
		return ""
	}
	return norm
}

// errUpgrade refuses a protocol switch on a request that carried a
// released value.
var errUpgrade = errors.New("a connection upgrade (WebSocket) is not relayed after a secret was released into its request")

// errSNI is a TLS ClientHello naming another server than the CONNECT.
var errSNI = errors.New("the TLS server name is not the CONNECT's host")

// intercept serves the client's TLS on c (the CONNECT already answered)
// as host, and each request on it through the secret proxy to host:port.
func (r *Relay) intercept(intern string, c net.Conn, host, port string) {
	s := r.secretsDoor()
	cert, err := s.Certificate(host)
	if err != nil {
		r.log.Warn("internet relay: no certificate to intercept", "dest", host, "err", err)
		c.Close()
		return
	}
	tc := tls.Server(c, &tls.Config{
		MinVersion: tls.VersionTLS12,
		// HTTP/1.1 only: each request is then one exchange the proxy reads
		// whole, and no HTTP/2 connection can be reused for another host
		// (coalescing).
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if hi.ServerName != "" && !strings.EqualFold(strings.TrimSuffix(hi.ServerName, "."), host) {
				return nil, errSNI
			}
			return cert, nil
		},
	})
	tc.SetDeadline(time.Now().Add(15 * time.Second))
	if err := tc.Handshake(); err != nil {
		r.log.Info("internet relay: intercepted handshake failed", "dest", host, "err", err)
		c.Close()
		return
	}
	tc.SetDeadline(time.Time{})
	r.serveOne(r.secretProxy(intern, host, port), tc, intern)
	tc.Close()
}

// secretReq is one intercepted request's state: the values released for
// it, which its response is redacted of.
type secretReq struct {
	intern, host string
	red          *httptool.Redactor
}

type secretReqCtx struct{}

// secretProxy forwards intercepted requests to host:port over TLS.
func (r *Relay) secretProxy(intern, host, port string) http.Handler {
	target := host
	if port != "443" {
		target = net.JoinHostPort(host, port)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "https", target, target
			st := pr.In.Context().Value(secretReqCtx{}).(*secretReq)
			r.fillSecrets(pr.In.Context(), pr.Out, st)
			if !st.red.Empty() {
				// Only encodings the redaction reads.
				if strings.Contains(strings.ToLower(pr.Out.Header.Get("Accept-Encoding")), "gzip") {
					pr.Out.Header.Set("Accept-Encoding", "gzip")
				} else {
					pr.Out.Header.Del("Accept-Encoding")
				}
			}
		},
		Transport: r.secretTransport,
		// 0: streamed answers (event streams, no length, redacted ones)
		// are flushed at each write anyway; a download is not.
		ModifyResponse: func(res *http.Response) error {
			st := res.Request.Context().Value(secretReqCtx{}).(*secretReq)
			if st.red.Empty() {
				return nil
			}
			if res.StatusCode == http.StatusSwitchingProtocols {
				// What follows an upgrade (a WebSocket) is spliced raw, where
				// no redaction reads: not after a release.
				res.Body.Close()
				return errUpgrade
			}
			return redactResponse(res, st.red)
		},
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if errors.Is(err, errUpgrade) {
				http.Error(w, "cohort: "+errUpgrade.Error(), http.StatusBadGateway)
				return
			}
			if errors.Is(err, errEncoding) {
				http.Error(w, "cohort: the host answered in a content encoding the proxy cannot check for released secrets", http.StatusBadGateway)
				return
			}
			r.log.Info("internet relay: intercepted request failed", "dest", target)
			http.Error(w, "cohort: the destination could not be reached", http.StatusBadGateway)
		},
		ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// The Host header must name the host the tunnel was opened to
		// (and the certificate made for): a request for another one is
		// not sent anywhere.
		if h := hostHeader(req.Host); h != "" && h != host {
			http.Error(w, "cohort: this connection is for "+host+", not "+h, http.StatusMisdirectedRequest)
			return
		}
		fullDuplex(w)
		st := &secretReq{intern: intern, host: host, red: &httptool.Redactor{}}
		ctx := context.WithValue(req.Context(), secretReqCtx{}, st)
		proxy.ServeHTTP(&redactingWriter{ResponseWriter: w, red: st.red}, req.WithContext(ctx))
		redactHeader(w.Header(), st.red)
	})
}

// hostHeader is a Host header's name: lower case, no port, no final dot.
func hostHeader(h string) string {
	if name, _, err := net.SplitHostPort(h); err == nil {
		h = name
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// urlPlaceholder is a placeholder in a URL, its braces as written or
// percent-encoded (clients escape them in paths).
var urlPlaceholder = regexp.MustCompile(`(?:\{|%7[bB])(?:\{|%7[bB])secret:([A-Za-z0-9_]+)(?:\}|%7[dD])(?:\}|%7[dD])`)

// fillSecrets replaces the placeholders of out's header values, Basic
// credentials, path and query by the values the vault releases for st's
// host. A name it does not release (unbound to this host, unknown) stays
// as written; the vault has audited the refusal.
func (r *Relay) fillSecrets(ctx context.Context, out *http.Request, st *secretReq) {
	s := r.secretsDoor()
	values := map[string]*string{} // nil: refused
	value := func(name string) (string, bool) {
		if v, ok := values[name]; ok {
			return deref(v), v != nil
		}
		v, err := s.Release(ctx, st.intern, name, st.host)
		if err != nil || v == "" {
			values[name] = nil
			return "", false
		}
		values[name] = &v
		st.red.Add(v, "{{secret:"+name+"}}")
		return v, true
	}
	fill := func(text string, re *regexp.Regexp, escape func(string) string) string {
		if !re.MatchString(text) {
			return text
		}
		return re.ReplaceAllStringFunc(text, func(m string) string {
			v, ok := value(re.FindStringSubmatch(m)[1])
			if !ok {
				return m
			}
			if escape != nil {
				return escape(v)
			}
			return v
		})
	}
	for name, vals := range out.Header {
		for i, v := range vals {
			if strings.EqualFold(name, "Authorization") {
				if nv := fillBasic(v, func(s string) string { return fill(s, httptool.Placeholder, nil) }); nv != v {
					// A server that echoes the header gives the encoded
					// credential back: it is redacted too.
					st.red.Add(nv[strings.IndexByte(nv, ' ')+1:], strings.TrimSpace(v[strings.IndexByte(v, ' ')+1:]))
					v = nv
				}
			}
			vals[i] = fill(v, httptool.Placeholder, nil)
		}
	}
	if p := out.URL.EscapedPath(); urlPlaceholder.MatchString(p) {
		np := fill(p, urlPlaceholder, url.PathEscape)
		if dec, err := url.PathUnescape(np); err == nil {
			out.URL.Path, out.URL.RawPath = dec, np
		}
	}
	out.URL.RawQuery = fill(out.URL.RawQuery, urlPlaceholder, url.QueryEscape)
}

// fillBasic substitutes in the user:password of a Basic credential, as
// git and curl -u send the URL's or the command line's.
func fillBasic(v string, fill func(string) string) string {
	scheme, enc, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return v
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return v
	}
	filled := fill(string(raw))
	if filled == string(raw) {
		return v
	}
	return scheme + " " + base64.StdEncoding.EncodeToString([]byte(filled))
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// bufferedConn reads what the CONNECT's reader already buffered (a
// ClientHello sent at once) before the connection's further bytes.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }
