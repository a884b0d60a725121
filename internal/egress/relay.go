// Package egress is the gateway's side of a jail's relays: the only ways an
// intern's processes reach anything outside their network namespace. Each
// connection arrives tagged with its kind:
//
//   - KindGateway: the gateway's own API (the vault, for the daemon's
//     http_request tool), served in process with the intern named in each
//     request (SetGateway), or spliced to a remote gateway's listener;
//   - KindModel: an HTTP reverse proxy to the operator's model endpoint
//     that carries model API calls only, puts the real model key in the
//     provider's auth header where the agent wrote its placeholder, and
//     redacts the key from every response, so the key never enters the
//     jail (model.go);
//   - KindInternet: an HTTP proxy (CONNECT and absolute-form requests) to
//     public addresses only: never the gateway's loopback services, private
//     ranges or the machine's own addresses;
//   - KindTraces: traces (OTLP/HTTP POST /v1/traces) to the operator's
//     collector, with its headers added on the way out.
package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cohort-dev/cohort/internal/httptool"
	"github.com/cohort-dev/cohort/internal/relayctx"
	"github.com/cohort-dev/cohort/internal/safehttp"
)

// Relay kinds: the byte a jail sends with each connection.
const (
	KindGateway  byte = 'g'
	KindModel    byte = 'm'
	KindInternet byte = 'i'
	KindTraces   byte = 't'
)

// DefaultMaxConnsPerIntern is how many relay connections (all kinds
// together) one intern may hold open at once; the next is closed at once,
// never queued. Each costs the gateway one descriptor, two while it has an
// upstream (a model request in flight, a CONNECT tunnel, a gateway
// request's answer): an agent's parallel tool calls, a package manager and
// a browser use tens, so 256 leaves them room while 256 × 2 × the awake
// interns stays far under the gateway's RLIMIT_NOFILE (serve logs the
// figure). Without a cap one intern's ~30,000 idle keep-alives used up the
// gateway's descriptors and another organization's chat got 502.
const DefaultMaxConnsPerIntern = 256

// FDsPerConn is how many gateway descriptors one relay connection can
// hold: its own and its upstream's.
const FDsPerConn = 2

// Default idle periods of a relay connection.
const (
	// DefaultIdleTimeout closes an HTTP relay connection (model, internet
	// proxy, traces, gateway API) with no request for this long; a request
	// in flight, however quiet (a model thinking), is not idle.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultTunnelIdleTimeout closes a spliced connection (a CONNECT
	// tunnel, the gateway relay of a remote daemon) with no byte either
	// way for this long. Longer than DefaultIdleTimeout: a tunnel's bytes
	// are opaque, and a quiet one may be a request waiting for a slow
	// answer.
	DefaultTunnelIdleTimeout = 5 * time.Minute
)

// refusalLogEvery bounds the log lines about one intern's refused
// connections: one per period, with the count since the last.
const refusalLogEvery = 10 * time.Second

// DefaultModelBaseURL is the model endpoint when none is configured (the
// OpenAI SDK's default, as for the built-in agent).
const DefaultModelBaseURL = "https://api.openai.com/v1"

// Config configures a Relay.
type Config struct {
	// GatewayAddr is host:port of the gateway's API listener; empty closes
	// KindGateway connections.
	GatewayAddr string
	// ModelBaseURL is the real model endpoint (DefaultModelBaseURL when
	// empty). Loopback and private addresses are allowed here: the
	// operator chose it.
	ModelBaseURL string
	// ModelAPIKey replaces Placeholder in a model request's auth header
	// (model.go says which), and Placeholder replaces it in responses;
	// empty substitutes nothing.
	ModelAPIKey string
	Placeholder string
	// ModelRoots are CAs trusted for an https model endpoint besides the
	// system's.
	ModelRoots []*x509.Certificate
	// UpstreamRoots are CAs trusted besides the system's for the hosts an
	// intercepted CONNECT (SetSecrets) goes on to: the operator's
	// --http-tool-ca-file.
	UpstreamRoots []*x509.Certificate
	// Internet enables KindInternet; otherwise every request gets 403.
	Internet bool
	// AllowLoopback lets KindInternet reach loopback addresses: tests only.
	AllowLoopback bool
	// Allow opens non-public destinations to KindInternet, as the operator
	// listed them (--intern-egress-allow-hosts); nil opens none.
	Allow *safehttp.Allowlist
	// TracesURL, when set, is where KindTraces sends traces (the
	// operator's OTLP/HTTP traces endpoint), with TracesHeaders (the
	// collector's credentials, which stay outside the jail).
	TracesURL     string
	TracesHeaders http.Header
	// MaxConnsPerIntern caps one intern's open relay connections
	// (DefaultMaxConnsPerIntern when 0).
	MaxConnsPerIntern int
	// IdleTimeout and TunnelIdleTimeout close idle relay connections
	// (DefaultIdleTimeout and DefaultTunnelIdleTimeout when 0).
	IdleTimeout, TunnelIdleTimeout time.Duration
	Log                            *slog.Logger
}

// Relay serves relay connections. Serve may be called concurrently.
// Every connection is counted against its intern's cap
// (MaxConnsPerIntern), and closed when idle.
type Relay struct {
	cfg   Config
	model *url.URL
	log   *slog.Logger

	modelH    http.Handler
	internetH http.Handler
	tracesH   http.Handler
	dialer    *net.Dialer
	forward   *http.Transport
	// modelTransport carries every model request, the operator's endpoint
	// and the jails' own upstreams alike.
	modelTransport *http.Transport

	// gatewayH, when set (SetGateway), serves KindGateway connections in
	// process instead of splicing them to GatewayAddr.
	gatewayH atomic.Pointer[http.Handler]
	// secrets, when set (SetSecrets), has CONNECTs to hosts with a bound
	// secret intercepted (intercept.go); secretTransport carries them on.
	secrets         atomic.Pointer[Secrets]
	secretTransport *http.Transport

	mu      sync.Mutex
	conns   map[net.Conn]string // open connections and their interns
	interns map[string]*internConns
	closed  bool
}

// internConns counts one intern's open relay connections.
type internConns struct {
	open    int
	refused int       // since the last log line
	logged  time.Time // of the last log line about refusals
}

// New validates cfg and returns a Relay.
func New(cfg Config) (*Relay, error) {
	if cfg.ModelBaseURL == "" {
		cfg.ModelBaseURL = DefaultModelBaseURL
	}
	u, err := url.Parse(cfg.ModelBaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("egress: the model base URL must be http:// or https:// with a host, not %q", cfg.ModelBaseURL)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxConnsPerIntern <= 0 {
		cfg.MaxConnsPerIntern = DefaultMaxConnsPerIntern
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.TunnelIdleTimeout <= 0 {
		cfg.TunnelIdleTimeout = DefaultTunnelIdleTimeout
	}
	r := &Relay{cfg: cfg, model: u, log: cfg.Log, conns: map[net.Conn]string{}, interns: map[string]*internConns{}}
	r.dialer = &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: safehttp.NewDialGuard(cfg.AllowLoopback).Control}
	r.forward = &http.Transport{DialContext: r.dialInternet, Proxy: nil, TLSHandshakeTimeout: 10 * time.Second,
		ResponseHeaderTimeout: time.Minute, MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second, DisableCompression: true}

	r.modelTransport = &http.Transport{Proxy: nil, DialContext: dialLocalhost((&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext),
		TLSClientConfig: safehttp.TLSConfig(cfg.ModelRoots), TLSHandshakeTimeout: 10 * time.Second, ForceAttemptHTTP2: true,
		MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second, DisableCompression: true}
	r.secretTransport = &http.Transport{DialContext: r.dialInternet, Proxy: nil, TLSClientConfig: safehttp.TLSConfig(cfg.UpstreamRoots),
		TLSHandshakeTimeout: 10 * time.Second, ForceAttemptHTTP2: true, ResponseHeaderTimeout: time.Minute,
		MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second, DisableCompression: true}
	static := func(context.Context) (string, error) { return cfg.ModelAPIKey, nil }
	r.modelH, r.internetH = r.modelProxy(u, static), http.HandlerFunc(r.internet)
	if cfg.TracesURL != "" {
		t, err := url.Parse(cfg.TracesURL)
		if err != nil || (t.Scheme != "http" && t.Scheme != "https") || t.Host == "" {
			return nil, fmt.Errorf("egress: the traces endpoint must be http:// or https:// with a host, not %q", cfg.TracesURL)
		}
		r.tracesH = r.tracesProxy(t)
	}
	return r, nil
}

// ServeModel relays one model connection of intern's jail that has its
// own model endpoint (a third-party agent's provider) to baseURL instead of
// the operator's, with key's value in place of the placeholder in the
// provider's auth header (model.go), redacted from the responses. key is asked
// per request, so a rotated vault secret applies at once; "" substitutes
// nothing, and an error refuses the request with 401 and a message that
// names no value. The connection counts against the intern's cap.
func (r *Relay) ServeModel(intern string, c net.Conn, baseURL string, key func(context.Context) (string, error)) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		r.log.Warn("model relay: bad upstream", "base_url_valid", false)
		c.Close()
		return
	}
	if !r.track(intern, c) {
		c.Close()
		return
	}
	defer r.untrack(c)
	r.serveOne(r.modelProxy(u, key), c, intern)
}

// SetGateway makes the gateway relay serve h, the gateway's API, on each
// connection in process, the intern in each request's context
// (relayctx.Intern): whatever keys on the client (the token-exchange
// limiter) then sees the intern, not 127.0.0.1. Without it the relay
// splices to GatewayAddr (a remote gateway, for `cohort intern --jail`).
func (r *Relay) SetGateway(h http.Handler) { r.gatewayH.Store(&h) }

// dialLocalhost dials names under .localhost on loopback, as RFC 6761
// reserves them, whatever the DNS says: an operator's model endpoint on
// this machine can then have a name with a dot, which vault host bindings
// require.
func dialLocalhost(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, port, err := net.SplitHostPort(addr); err == nil && strings.HasSuffix(strings.ToLower(strings.TrimSuffix(host, ".")), ".localhost") {
			addr = net.JoinHostPort("127.0.0.1", port)
		}
		return dial(ctx, network, addr)
	}
}

// modelReq is what the model relay decided for one request: the key and
// where it goes.
type modelReq struct {
	key  string
	plan modelPlan
	red  *httptool.Redactor // nil: nothing to redact
}

type modelReqCtx struct{}

// modelProxy forwards model API calls to u, with key's value in the
// provider's own auth header where the agent put the placeholder there
// (checkModel), and the key redacted from every response.
func (r *Relay) modelProxy(u *url.URL, key func(context.Context) (string, error)) http.Handler {
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = u.Scheme, u.Host, u.Host
			m, _ := pr.In.Context().Value(modelReqCtx{}).(modelReq)
			m.plan.apply(pr.Out, m.key)
		},
		Transport: r.modelTransport,
		// Model responses are event streams: every chunk goes out at once.
		FlushInterval: -1,
		BufferPool:    copyBuffers,
		ModifyResponse: func(res *http.Response) error {
			m, _ := res.Request.Context().Value(modelReqCtx{}).(modelReq)
			if m.red == nil {
				// No key to redact, yet an answer it cannot read as one
				// coding is not passed on either.
				_, err := contentCoding(res.Header)
				return err
			}
			return redactResponse(res, m.red)
		},
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if errors.Is(err, errEncoding) {
				r.log.Warn("model relay: an answer in an encoding it cannot read", "host", u.Host)
				modelError(w, http.StatusBadGateway, "api_error", "upstream_encoding", errEncoding.Error())
				return
			}
			// The error may name the upstream; never the key (it is only in
			// the outgoing request's headers).
			r.log.Warn("model relay: upstream failed", "host", u.Host, "err", errors.Unwrap(err) != nil)
			http.Error(w, "the model endpoint could not be reached", http.StatusBadGateway)
		},
		ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fullDuplex(w)
		plan, refused := checkModel(req, u.Path, r.cfg.Placeholder)
		if refused != nil {
			r.log.Info("model relay: refused", "host", u.Host, "method", req.Method, "path", clip(req.URL.Path), "reason", refused.code)
			modelError(w, http.StatusForbidden, "permission_error", refused.code, refused.message)
			return
		}
		k, err := key(req.Context())
		if err != nil {
			r.log.Warn("model relay: no key", "host", u.Host, "err", err)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":{"type":"authentication_error","message":%q}}`, "cohort: "+err.Error())
			return
		}
		m := modelReq{key: k, plan: plan}
		if k == "" || r.cfg.Placeholder == "" {
			proxy.ServeHTTP(w, req.WithContext(context.WithValue(req.Context(), modelReqCtx{}, m)))
			return
		}
		m.red = &httptool.Redactor{}
		m.red.Add(k, r.cfg.Placeholder)
		proxy.ServeHTTP(&redactingWriter{ResponseWriter: w, red: m.red}, req.WithContext(context.WithValue(req.Context(), modelReqCtx{}, m)))
		// Trailers, set after the body.
		redactHeader(w.Header(), m.red)
	})
}

// copyBuffers are the model relay's copy buffers: 8 KiB, where
// ReverseProxy's own are 32 KiB, since one is held for as long as a model
// stream is open (issue 41's memory per stream) and its events are a few
// hundred bytes each.
var copyBuffers = &bufferPool{sync.Pool{New: func() any { b := make([]byte, 8<<10); return &b }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(p []byte) { b.p.Put(&p) }

// tracesProxy forwards OTLP trace exports (POST /v1/traces, at most 4 MiB)
// to the operator's endpoint t, adding its headers; anything else is 404.
func (r *Relay) tracesProxy(t *url.URL) http.Handler {
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			u := *t
			pr.Out.URL, pr.Out.Host = &u, t.Host
			for k, v := range r.cfg.TracesHeaders {
				pr.Out.Header[k] = v
			}
		},
		Transport: r.modelTransport,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			r.log.Warn("traces relay: collector failed", "host", t.Host)
			http.Error(w, "the trace collector could not be reached", http.StatusBadGateway)
		},
		ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.NotFound(w, req)
			return
		}
		req.Body = http.MaxBytesReader(w, req.Body, 4<<20)
		proxy.ServeHTTP(w, req)
	})
}

// Model is the model relay of one endpoint over HTTP (intern Pods reach it
// on the gateway's listener): baseURL with key's value in place of the
// placeholder, or, for "", the operator's endpoint and key.
func (r *Relay) Model(baseURL string, key func(context.Context) (string, error)) (http.Handler, error) {
	if baseURL == "" {
		return r.modelH, nil
	}
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("egress: bad model endpoint")
	}
	return r.modelProxy(u, key), nil
}

// ModelPath is the operator's model endpoint's path: relayed URLs keep it.
func (r *Relay) ModelPath() string { return strings.TrimRight(r.model.EscapedPath(), "/") }

// InJailModelURL is the base URL agents use inside the jail: the relay's
// in-jail address with the real endpoint's path, so paths pass unchanged.
func (r *Relay) InJailModelURL(addr string) string {
	return "http://" + addr + strings.TrimRight(r.model.EscapedPath(), "/")
}

// Serve handles one connection of the given kind from intern's jail and
// closes it; it returns when the connection is done. A connection past
// the intern's cap is closed at once.
func (r *Relay) Serve(intern string, kind byte, c net.Conn) {
	if !r.track(intern, c) {
		c.Close()
		return
	}
	defer r.untrack(c)
	switch kind {
	case KindGateway:
		r.gateway(intern, c)
	case KindModel:
		r.serveOne(r.modelH, c, intern)
	case KindInternet:
		r.serveOne(r.internetH, c, intern)
	case KindTraces:
		if r.tracesH == nil {
			c.Close()
			return
		}
		r.serveOne(r.tracesH, c, intern)
	default:
		c.Close()
	}
}

// Hold counts one request of intern's against the same cap as its relay
// connections, for intern Pods' model relay, whose connections are the
// gateway listener's (idle ones bounded by its timeouts) and are known as
// the intern's only once a request names it: release when the request is
// done; false past the cap (refuse it at once).
func (r *Relay) Hold(intern string) (release func(), ok bool) {
	c := new(heldConn)
	if !r.track(intern, c) {
		return nil, false
	}
	return func() { r.untrack(c) }, true
}

// heldConn stands for one held request in the relay's bookkeeping; Close
// (the relay's) does nothing to it.
type heldConn struct{ net.Conn }

func (*heldConn) Close() error { return nil }

// track counts c against intern's cap; false: closed relay, or the intern
// is at its cap (logged, at most once per refusalLogEvery per intern).
func (r *Relay) track(intern string, c net.Conn) bool {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return false
	}
	n := r.interns[intern]
	if n == nil {
		n = &internConns{}
		r.interns[intern] = n
	}
	if n.open >= r.cfg.MaxConnsPerIntern {
		n.refused++
		refused, now := n.refused, time.Now()
		logIt := now.Sub(n.logged) >= refusalLogEvery
		if logIt {
			n.logged, n.refused = now, 0
		}
		r.mu.Unlock()
		if logIt {
			r.log.Warn("relay: connections refused, the intern is at its cap", "intern", intern, "cap", r.cfg.MaxConnsPerIntern, "refused", refused)
		}
		return false
	}
	n.open++
	r.conns[c] = intern
	r.mu.Unlock()
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	intern, ok := r.conns[c]
	if !ok {
		return
	}
	delete(r.conns, c)
	if n := r.interns[intern]; n != nil {
		// An intern at its cap keeps its entry (and its log rate) while
		// it holds anything.
		if n.open--; n.open == 0 {
			delete(r.interns, intern)
		}
	}
}

// Open is how many relay connections intern holds now.
func (r *Relay) Open(intern string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.interns[intern]; n != nil {
		return n.open
	}
	return 0
}

// MaxConnsPerIntern is the cap on one intern's open relay connections.
func (r *Relay) MaxConnsPerIntern() int { return r.cfg.MaxConnsPerIntern }

// Close closes every open relay connection; later ones are refused.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.forward.CloseIdleConnections()
	r.secretTransport.CloseIdleConnections()
	return nil
}

// serveOne serves HTTP/1.1 on one connection of intern's until it closes
// or has no request for the idle period; each request's context names the
// intern (relayctx). It returns when the connection is done, a hijacked
// one (a CONNECT tunnel) included, so the intern's count holds it until
// then.
func (r *Relay) serveOne(h http.Handler, c net.Conn, intern string) {
	ln := &oneConn{c: c, done: make(chan struct{})}
	var handlers sync.WaitGroup
	counted := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		h.ServeHTTP(w, req)
	})
	srv := &http.Server{Handler: counted, ReadHeaderTimeout: 30 * time.Second, MaxHeaderBytes: 64 << 10,
		IdleTimeout: r.cfg.IdleTimeout,
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return relayctx.WithIntern(ctx, intern)
		},
		ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				ln.close()
			}
		}}
	srv.Serve(ln)
	handlers.Wait()
}

// oneConn is a listener that yields one connection, then blocks until it
// is done.
type oneConn struct {
	c    net.Conn
	once sync.Once
	used bool
	done chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	if !l.used {
		l.used = true
		return l.c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) close()         { l.once.Do(func() { close(l.done) }) }
func (l *oneConn) Close() error   { l.close(); return nil }
func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// gateway serves the gateway's API on c: in process when SetGateway gave
// the handler, else spliced to the gateway's API listener.
func (r *Relay) gateway(intern string, c net.Conn) {
	if h := r.gatewayH.Load(); h != nil {
		r.serveOne(*h, c, intern)
		return
	}
	defer c.Close()
	if r.cfg.GatewayAddr == "" {
		return
	}
	up, err := net.DialTimeout("tcp", r.cfg.GatewayAddr, 10*time.Second)
	if err != nil {
		r.log.Warn("gateway relay: dial failed", "err", err)
		return
	}
	defer up.Close()
	splice(c, up, r.cfg.TunnelIdleTimeout)
}

// splice copies both ways, passing on each side's end of writing, until
// both ends are done or no byte has passed either way for idle: then it
// closes both.
func splice(a, b net.Conn, idle time.Duration) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var watch *time.Timer
	watch = time.AfterFunc(idle, func() {
		if quiet := time.Since(time.Unix(0, last.Load())); quiet < idle {
			watch.Reset(idle - quiet)
			return
		}
		a.Close()
		b.Close()
	})
	defer watch.Stop()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.CopyBuffer(dst, activity{src, &last}, make([]byte, 32<<10))
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

// activity notes the time of each read that brought bytes.
type activity struct {
	r    io.Reader
	last *atomic.Int64
}

func (a activity) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.last.Store(time.Now().UnixNano())
	}
	return n, err
}

// dialInternet dials a destination of the internet relay: a public
// address (the dialer's guard checks the address it connects to), or one
// the operator's allowlist opens, dialled at the address checked. Names
// under .localhost are loopback (RFC 6761), so only a listed loopback
// range reaches them.
func (r *Relay) dialInternet(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var ips []netip.Addr
	if name := strings.ToLower(strings.TrimSuffix(host, ".")); name == "localhost" || strings.HasSuffix(name, ".localhost") {
		ips = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	if r.cfg.Allow != nil {
		if ips == nil {
			if ip, err := netip.ParseAddr(host); err == nil {
				ips = []netip.Addr{ip}
			} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
				return nil, err
			}
		}
		for _, ip := range ips {
			if r.cfg.Allow.Permits(host, ip) {
				d := net.Dialer{Timeout: r.dialer.Timeout, KeepAlive: r.dialer.KeepAlive}
				return d.DialContext(ctx, network, net.JoinHostPort(ip.Unmap().String(), port))
			}
		}
	}
	return r.dialer.DialContext(ctx, network, addr)
}

// fullDuplex lets a relayed request's body still be read once the
// upstream's answer has begun. An HTTP/1 server otherwise closes the body
// when the response starts, and the transport, whose last read of the body
// (the check for its end) can come after the upstream's first bytes, then
// drops the upstream connection mid-stream: agents saw "stream
// disconnected" on one turn in a dozen.
func fullDuplex(w http.ResponseWriter) {
	http.NewResponseController(w).EnableFullDuplex()
}

// internet is the forward proxy.
func (r *Relay) internet(w http.ResponseWriter, req *http.Request) {
	if !r.cfg.Internet {
		http.Error(w, "internet egress is disabled for this intern", http.StatusForbidden)
		return
	}
	if req.Method == http.MethodConnect {
		r.connect(w, req)
		return
	}
	if !req.URL.IsAbs() || req.URL.Scheme != "http" {
		http.Error(w, "this is a proxy: send absolute-form http:// requests or CONNECT", http.StatusBadRequest)
		return
	}
	fullDuplex(w)
	out := req.Clone(req.Context())
	out.RequestURI = ""
	removeHopHeaders(out.Header)
	res, err := r.forward.RoundTrip(out)
	if err != nil {
		r.refuse(w, req.URL.Host, err)
		return
	}
	defer res.Body.Close()
	removeHopHeaders(res.Header)
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	io.Copy(flushWriter{w}, res.Body)
}

// connect opens a tunnel to a public address.
func (r *Relay) connect(w http.ResponseWriter, req *http.Request) {
	host := req.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		http.Error(w, "CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	intern, _ := relayctx.Intern(req.Context())
	if name := r.interceptHost(req.Context(), intern, host); name != "" {
		_, port, _ := net.SplitHostPort(host)
		hj, ok := w.(http.Hijacker)
		if !ok {
			http.Error(w, "tunnels are not supported here", http.StatusInternalServerError)
			return
		}
		c, brw, err := hj.Hijack()
		if err != nil {
			return
		}
		r.log.Debug("internet relay: intercepted", "dest", host)
		c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
		r.intercept(intern, bufferedConn{c, brw.Reader}, name, port)
		return
	}
	ctx, cancel := context.WithTimeout(req.Context(), 15*time.Second)
	up, err := r.dialInternet(ctx, "tcp", host)
	cancel()
	if err != nil {
		r.refuse(w, host, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "tunnels are not supported here", http.StatusInternalServerError)
		return
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	r.log.Debug("internet relay: tunnel", "dest", host)
	c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
	// Bytes the client sent after its request are already buffered.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		up.Write(b)
	}
	splice(c, up, r.cfg.TunnelIdleTimeout)
	c.Close()
	up.Close()
}

// refuse answers a dial that failed: 403 when the guard refused it.
func (r *Relay) refuse(w http.ResponseWriter, dest string, err error) {
	if errors.Is(err, safehttp.ErrRefusedAddress) {
		r.log.Info("internet relay: destination refused", "dest", dest)
		http.Error(w, "the destination is not allowed", http.StatusForbidden)
		return
	}
	http.Error(w, "the destination could not be reached", http.StatusBadGateway)
}

var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	http.NewResponseController(f.w).Flush()
	return n, err
}
