// Package safehttp is the one HTTP client the service uses to fetch URLs an
// admin typed in (identity provider discovery documents and JWKS). Such a
// URL is attacker-influenced: without a guard it reaches the metadata
// service, the database or anything else on the private network
// (server-side request forgery). The client therefore speaks https only,
// refuses loopback, private, link-local and other non-public addresses at
// dial time (so DNS tricks and redirects cannot get around it), follows
// only https redirects, ignores proxy settings from the environment, and
// bounds time and response size.
package safehttp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"syscall"
	"time"
)

// Defaults for Options fields left zero.
const (
	DefaultTimeout      = 10 * time.Second
	DefaultDialTimeout  = 5 * time.Second
	DefaultMaxBody      = 1 << 20
	DefaultMaxRedirects = 3
)

// Options configure a client. The zero value is the production setting.
type Options struct {
	// Timeout bounds a whole request, body included.
	Timeout time.Duration
	// MaxBody bounds a response body; reading past it fails.
	MaxBody int64
	// ExtraRoots are trusted in addition to the system roots (a private
	// identity provider's CA, or a test server's certificate).
	ExtraRoots []*x509.Certificate
	// AllowLoopback lets the client reach 127.0.0.0/8 and ::1. For tests
	// only (an in-process TLS issuer); never set from configuration.
	AllowLoopback bool
	// Allow lets the client reach the non-public destinations an operator
	// listed (--federation-allow-hosts); nil allows none.
	Allow *Allowlist
}

// ErrRefusedAddress is returned (wrapped) when a connection would reach an
// address that is not public.
var ErrRefusedAddress = errors.New("safehttp: refused to connect to a non-public address")

// ErrTooLarge is returned while reading a body larger than MaxBody.
var ErrTooLarge = errors.New("safehttp: response body too large")

// ErrScheme is returned for a request or redirect that is not https.
var ErrScheme = errors.New("safehttp: only https URLs are fetched")

// New returns a guarded client.
func New(o Options) *http.Client {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxBody <= 0 {
		o.MaxBody = DefaultMaxBody
	}
	dialTimeout := min(DefaultDialTimeout, o.Timeout)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, _ := net.SplitHostPort(addr)
		d := &net.Dialer{
			Timeout:   dialTimeout,
			KeepAlive: 30 * time.Second,
			// Control runs after DNS resolution, on the address actually
			// dialled: the only place a check cannot be raced by a second
			// DNS answer. The host the URL named decides what is allowed.
			Control: func(network, address string, _ syscall.RawConn) error {
				return checkDial(network, address, host, o.AllowLoopback, o.Allow)
			},
		}
		return d.DialContext(ctx, network, addr)
	}
	tlsConfig := TLSConfig(o.ExtraRoots)
	transport := &http.Transport{
		Proxy:                  nil, // an environment proxy would dial for us, past the guard
		DialContext:            dial,
		TLSClientConfig:        tlsConfig,
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    dialTimeout,
		ResponseHeaderTimeout:  o.Timeout,
		MaxResponseHeaderBytes: 64 << 10,
		MaxIdleConns:           32,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
	}
	return &http.Client{
		Timeout:   o.Timeout,
		Transport: &guard{next: transport, maxBody: o.MaxBody, allowLoopback: o.AllowLoopback, allow: o.Allow},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= DefaultMaxRedirects {
				return fmt.Errorf("safehttp: stopped after %d redirects", DefaultMaxRedirects)
			}
			return checkURL(req, o.AllowLoopback, o.Allow)
		},
	}
}

// checkURL refuses non-https requests, and literal addresses the dial
// check would refuse anyway (to fail with a clear error before dialling).
func checkURL(req *http.Request, allowLoopback bool, allow *Allowlist) error {
	if req.URL.Scheme != "https" {
		return fmt.Errorf("%w: %q", ErrScheme, req.URL.Scheme)
	}
	if req.URL.User != nil {
		return errors.New("safehttp: URLs with credentials are not fetched")
	}
	if ip, err := netip.ParseAddr(req.URL.Hostname()); err == nil {
		if err := CheckAddr(ip, allowLoopback); err != nil && !allow.Permits(req.URL.Hostname(), ip) {
			return err
		}
	}
	return nil
}

func checkDial(network, address, host string, allowLoopback bool, allow *Allowlist) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return fmt.Errorf("%w: network %q", ErrRefusedAddress, network)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %q", ErrRefusedAddress, address)
	}
	if err := CheckAddr(ap.Addr(), allowLoopback); err != nil && !allow.Permits(host, ap.Addr()) {
		return err
	}
	return nil
}

// refused are the ranges that are not public unicast, beyond what the
// netip predicates cover.
var refused = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),          // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),      // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),       // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),       // documentation
	netip.MustParsePrefix("198.18.0.0/15"),      // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"),    // documentation
	netip.MustParsePrefix("203.0.113.0/24"),     // documentation
	netip.MustParsePrefix("240.0.0.0/4"),        // reserved, broadcast
	netip.MustParsePrefix("64:ff9b::/96"),       // NAT64: may embed a private IPv4
	netip.MustParsePrefix("64:ff9b:1::/48"),     // local-use NAT64
	netip.MustParsePrefix("100::/64"),           // discard
	netip.MustParsePrefix("2001::/32"),          // Teredo: embeds an IPv4
	netip.MustParsePrefix("2001:db8::/32"),      // documentation
	netip.MustParsePrefix("2002::/16"),          // 6to4: embeds an IPv4
	netip.MustParsePrefix("fec0::/10"),          // deprecated site-local
	netip.MustParsePrefix("::/128"),             // unspecified
	netip.MustParsePrefix("::/96"),              // IPv4-compatible (deprecated): ::10.0.0.1 embeds an IPv4
	netip.MustParsePrefix("::ffff:0:0:0/96"),    // IPv4-translated
	netip.MustParsePrefix("2001:10::/28"),       // ORCHID
	netip.MustParsePrefix("2001:20::/28"),       // ORCHIDv2
	netip.MustParsePrefix("5f00::/16"),          // SRv6 SIDs
	netip.MustParsePrefix("3fff::/20"),          // documentation
	netip.MustParsePrefix("169.254.169.254/32"), // cloud metadata (also link-local)
}

// CheckAddr reports whether ip may be connected to: it must be public
// unicast. Loopback is allowed only with allowLoopback.
func CheckAddr(ip netip.Addr, allowLoopback bool) error {
	ip = ip.Unmap() // ::ffff:10.0.0.1 is 10.0.0.1
	if ip.IsLoopback() {
		if allowLoopback {
			return nil
		}
		return fmt.Errorf("%w: %s is a loopback address", ErrRefusedAddress, ip)
	}
	switch {
	case !ip.IsValid(), ip.IsUnspecified():
		return fmt.Errorf("%w: %s is unspecified", ErrRefusedAddress, ip)
	case ip.IsPrivate():
		return fmt.Errorf("%w: %s is a private address", ErrRefusedAddress, ip)
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return fmt.Errorf("%w: %s is a link-local address", ErrRefusedAddress, ip)
	case ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return fmt.Errorf("%w: %s is a multicast address", ErrRefusedAddress, ip)
	case !ip.IsGlobalUnicast():
		return fmt.Errorf("%w: %s is not a unicast address", ErrRefusedAddress, ip)
	}
	for _, p := range refused {
		if p.Contains(ip) {
			return fmt.Errorf("%w: %s is in reserved range %s", ErrRefusedAddress, ip, p)
		}
	}
	return nil
}

// guard checks each request before it leaves and bounds each response body.
type guard struct {
	next          http.RoundTripper
	maxBody       int64
	allowLoopback bool
	allow         *Allowlist
}

func (g *guard) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := checkURL(req, g.allowLoopback, g.allow); err != nil {
		return nil, err
	}
	res, err := g.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if res.ContentLength > g.maxBody {
		res.Body.Close()
		return nil, fmt.Errorf("%w: %d bytes announced, at most %d read", ErrTooLarge, res.ContentLength, g.maxBody)
	}
	res.Body = &capped{rc: res.Body, left: g.maxBody}
	return res, nil
}

// capped fails a read that goes past the cap, rather than silently
// truncating: a truncated document must not parse as a shorter valid one.
type capped struct {
	rc   io.ReadCloser
	left int64
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, ErrTooLarge
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.rc.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n - 1, ErrTooLarge
	}
	return n, err
}

func (c *capped) Close() error { return c.rc.Close() }

// ExtraRootsFromFile reads PEM certificates to trust in addition to the
// system roots (the --extra-ca-file setting). An empty path gives none.
func ExtraRootsFromFile(path string) ([]*x509.Certificate, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("extra CA file: %w", err)
	}
	var certs []*x509.Certificate
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("extra CA file %s: %w", path, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("extra CA file %s: no PEM certificate found", path)
	}
	return certs, nil
}

// TLSConfig is the TLS client configuration of every guarded client: TLS
// 1.2 or later, the system roots plus extra (for a test or private CA).
func TLSConfig(extra []*x509.Certificate) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(extra) > 0 {
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		for _, cert := range extra {
			pool.AddCert(cert)
		}
		c.RootCAs = pool
	}
	return c
}

// DialGuard refuses, in a dialer's Control hook (after DNS resolution, on
// the address actually dialled), every address CheckAddr refuses and the
// machine's own interface addresses: a request from this service never
// reaches the service's host, even on a public address.
type DialGuard struct {
	allowLoopback bool
	own           map[netip.Addr]bool
}

// NewDialGuard collects the machine's own (non-loopback) addresses.
func NewDialGuard(allowLoopback bool) *DialGuard {
	g := &DialGuard{allowLoopback: allowLoopback, own: map[netip.Addr]bool{}}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLoopback() {
				g.own[p.Addr().Unmap()] = true
			}
		}
	}
	return g
}

// Control is a net.Dialer Control hook.
func (g *DialGuard) Control(network, address string, _ syscall.RawConn) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return fmt.Errorf("%w: network %s", ErrRefusedAddress, network)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrRefusedAddress, address)
	}
	ip := ap.Addr().Unmap()
	if g.own[ip] {
		return fmt.Errorf("%w: %s is one of this service's own addresses", ErrRefusedAddress, ip)
	}
	return CheckAddr(ip, g.allowLoopback)
}

// CheckURL reports whether client c, when it is a guarded client, would
// refuse to connect to rawURL's host by its address policy: it resolves
// the host now and applies the same check the dial applies later. It
// answers an error wrapping ErrRefusedAddress only when every address the
// host resolves to is refused (the fetch could never succeed); a host
// that does not resolve now, or a client that is not guarded, gives nil:
// the fetch will say what went wrong. Meant for refusing a URL when it is
// saved; the dial-time check stays the one that holds.
func CheckURL(ctx context.Context, c *http.Client, rawURL string) error {
	if c == nil {
		return nil
	}
	g, ok := c.Transport.(*guard)
	if !ok {
		return nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil
	}
	host := u.Hostname()
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		addrs, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil
		}
	}
	var first error
	for _, ip := range addrs {
		err := checkDial("tcp", netip.AddrPortFrom(ip.Unmap(), 443).String(), host, g.allowLoopback, g.allow)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}
