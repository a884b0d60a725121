package webhooks

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/safehttp"
)

// Endpoint URLs are typed by workspace key holders, so deliveries go
// through the same address policy as identity provider fetches
// (internal/safehttp): public addresses only, unless the operator lists a
// host, address or range in --webhook-allow-hosts; 169.254.169.254 never.
// The check runs when an endpoint is saved (a clear 400) and again at
// dial time, on the address actually dialled (DNS rebinding cannot get
// around it). Plain http is taken only for a listed destination (a
// receiver on the operator's own network); anything public is https.

// AllowSetting names the operator's setting in errors.
var AllowSetting = config.Setting("webhook-allow-hosts")

// MaxURL bounds an endpoint URL.
const MaxURL = 2048

// errRefused wraps every refusal of the address policy.
var errRefused = errors.New("webhooks: destination refused by the egress policy")

// checkURLSyntax validates the form of an endpoint URL.
func checkURLSyntax(raw string) (*url.URL, error) {
	if raw == "" || len(raw) > MaxURL {
		return nil, apierr.BadRequest("url must be 1 to %d characters", MaxURL)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return nil, apierr.BadRequest("url must be an absolute https:// URL")
	}
	if u.User != nil {
		return nil, apierr.BadRequest("url must not carry credentials")
	}
	if u.Fragment != "" {
		return nil, apierr.BadRequest("url must not carry a fragment")
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return nil, apierr.BadRequest("url must be an https:// URL, not %q", u.Scheme)
	}
	return u, nil
}

// permitted is the address rule: public, or allowed by the operator.
func permitted(host string, ip netip.Addr, allow *safehttp.Allowlist) error {
	if err := safehttp.CheckAddr(ip, false); err != nil {
		if allow.Permits(host, ip) {
			return nil
		}
		return fmt.Errorf("%w: %v", errRefused, err)
	}
	return nil
}

// checkDestination resolves u's host now and refuses it when every
// address is refused: the save-time check (the dial-time one holds).
func checkDestination(ctx context.Context, u *url.URL, allow *safehttp.Allowlist) error {
	host := u.Hostname()
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		addrs, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			if u.Scheme == "http" {
				return apierr.BadRequest("url must be https://: plain http is only for a receiver on a private address that %s lists", AllowSetting)
			}
			// Not resolvable now: the deliveries will say what went wrong.
			return nil
		}
	}
	var first error
	ok := false
	for _, ip := range addrs {
		ip = ip.Unmap()
		if u.Scheme == "http" && (safehttp.CheckAddr(ip, false) == nil || !allow.Permits(host, ip)) {
			return apierr.BadRequest("url must be https://: plain http is only for a receiver on a private address that %s lists", AllowSetting)
		}
		err := permitted(host, ip, allow)
		if err == nil {
			ok = true
		} else if first == nil {
			first = err
		}
	}
	if !ok && first != nil {
		return apierr.BadRequest("url: %s resolves to addresses the egress policy refuses (%v); an operator allows a private receiver by listing its host or range in %s",
			host, strings.TrimPrefix(first.Error(), errRefused.Error()+": "), AllowSetting)
	}
	return nil
}

// ClientOptions configure the delivery client.
type ClientOptions struct {
	// Timeout bounds one attempt, the body sent and the answer read.
	Timeout time.Duration
	// Allow is --webhook-allow-hosts; nil allows only public addresses.
	Allow *safehttp.Allowlist
	// ExtraRoots are trusted besides the system roots (--extra-ca-file).
	ExtraRoots []*x509.Certificate
}

// NewClient returns the guarded client deliveries use: the address rule
// at dial time, no proxy from the environment, no redirects (a 3xx is a
// failed attempt, as Standard Webhooks says), a bound on time.
func NewClient(o ClientOptions) *http.Client {
	if o.Timeout <= 0 {
		o.Timeout = DefaultAttemptTimeout
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, _ := net.SplitHostPort(addr)
		d := &net.Dialer{Timeout: min(5*time.Second, o.Timeout), KeepAlive: 30 * time.Second,
			Control: func(network, address string, _ syscall.RawConn) error {
				switch network {
				case "tcp", "tcp4", "tcp6":
				default:
					return fmt.Errorf("%w: network %q", errRefused, network)
				}
				ap, err := netip.ParseAddrPort(address)
				if err != nil {
					return fmt.Errorf("%w: %q", errRefused, address)
				}
				return permitted(host, ap.Addr().Unmap(), o.Allow)
			}}
		return d.DialContext(ctx, network, addr)
	}
	return &http.Client{
		Timeout: o.Timeout,
		Transport: &http.Transport{
			Proxy:                  nil,
			DialContext:            dial,
			TLSClientConfig:        safehttp.TLSConfig(o.ExtraRoots),
			ForceAttemptHTTP2:      true,
			TLSHandshakeTimeout:    min(10*time.Second, o.Timeout),
			ResponseHeaderTimeout:  o.Timeout,
			MaxResponseHeaderBytes: 64 << 10,
			MaxIdleConns:           64,
			MaxIdleConnsPerHost:    8,
			IdleConnTimeout:        90 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
