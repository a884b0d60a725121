// Package httptool is the http_request tool an intern's daemon executes on
// its agent's behalf. The agent names secrets with {{secret:NAME}}
// placeholders in the URL, headers or body; the tool asks the vault (through
// a Releaser, the gateway) for each value for the request's exact host,
// substitutes, sends the request over a guarded connection, follows
// redirects hop by hop without ever carrying a released value to another
// host, and hands back the response with every released value replaced by
// its placeholder again. The agent process never holds a secret value.
package httptool

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/vaulthost"
)

// Name is the tool's name, and the permission's operation in manual mode.
const Name = "http_request"

// Description tells the model what the tool does and how to use secrets.
const Description = "Send an HTTPS request and return its status, headers and body. " +
	"To use a secret from your vault, write {{secret:NAME}} in the URL, a header value or the body: " +
	"it is filled in only when the request goes to one of the hosts the secret is bound to, and you never see the value " +
	"(it is replaced by the placeholder again in the response). The user may have to approve requests that use secrets."

// InputSchema is the tool's JSON Schema.
var InputSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"method":  map[string]any{"type": "string", "description": "GET (default), HEAD, POST, PUT, PATCH, DELETE or OPTIONS."},
		"url":     map[string]any{"type": "string", "description": "https:// URL; a URL without a scheme is taken as https."},
		"headers": map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}, "description": "Request headers."},
		"body":    map[string]any{"type": "string", "description": "Request body (text)."},
	},
	"required":             []string{"url"},
	"additionalProperties": false,
}

// Bounds of a request.
const (
	MaxURL        = 8 << 10
	MaxHeaders    = 64
	MaxHeaderSize = 8 << 10
	MaxReqBody    = 1 << 20
	// DefaultMaxResponse bounds the response body the agent sees.
	DefaultMaxResponse = 1 << 20
	DefaultTimeout     = 30 * time.Second
	DefaultRedirects   = 5
)

// Args are the tool's arguments.
type Args struct {
	Method  string            `json:"method,omitempty"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    *string           `json:"body,omitempty"`
}

// Refusals and failures are *apierr.Error, Cohort's one error model. The
// message is for the model (what went wrong and what to do) and never holds
// a secret value; the status and reason are the ones the daemon and the
// gateway already use:
//
//   - 400 bad_request: the arguments, method, URL or headers; secrets for a
//     host that is not a DNS name (the vault's invalid_host refusal is a 400
//     bad_request too)
//   - 413 payload_too_large: a body over MaxReqBody
//   - a secret not released: the vault's own status and reason (403
//     host_not_allowed, 403 secret_unbound, 404 not_found, 400
//     bad_request), or 502 when the vault could not be asked
//   - 403 forbidden: the destination's address is not public (the egress
//     relay answers such a dial with 403 too)
//   - 502 without a reason: the destination could not be reached (as the
//     egress relay answers); 502 stream_severed: the response broke off
//   - 504 timeout; 499 client_closed_request: the run went away first
//   - 500 internal, a bug (apierr.Bug): the vault released a value for a
//     host it never releases for
//
// A failure's cause is not kept: net/http's errors hold the URL, which may
// hold a released value.

// refuse is a 400 bad_request for the model.
func refuse(format string, args ...any) error { return apierr.BadRequest(format, args...) }

// notReleased is a secret the Releaser did not release: the vault's status
// and reason when it said why, else 502; its message either way.
func notReleased(name, host string, err error) error {
	e := &apierr.Error{Status: http.StatusBadGateway, Message: err.Error(), Cause: err}
	var ae *apierr.Error
	if errors.As(err, &ae) {
		e.Status, e.Reason, e.Message, e.Bug = ae.Status, ae.Reason, ae.Message, ae.Bug
	}
	e.Message = fmt.Sprintf("secret %q was not released for host %q: %s", name, host, e.Message)
	return e
}

// failed is a request that did not complete: what names the step, and the
// message says why, with every released value redacted. broke is a
// response that broke off after it began.
func failed(what string, err error, redact func(string) string, broke bool) error {
	status, reason := http.StatusBadGateway, apierr.Reason("")
	if broke {
		reason = apierr.ReasonStreamSevered
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		status, reason = http.StatusGatewayTimeout, apierr.ReasonTimeout
	case errors.Is(err, context.Canceled):
		status, reason = 499, apierr.ReasonClientClosedRequest
	case errors.Is(err, safehttp.ErrRefusedAddress):
		status, reason = http.StatusForbidden, apierr.ReasonForbidden
	}
	return apierr.New(status, reason, "%s: %s", what, redact(cleanErr(err)))
}

// DecodeArgs decodes arguments strictly: unknown keys, a missing url, or
// wrong types are refused with the expected shape.
func DecodeArgs(raw []byte) (*Args, error) {
	const shape = `expected {"url": "https://…", "method"?: "GET", "headers"?: {"Name": "value"}, "body"?: "…"}`
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var a Args
	if err := dec.Decode(&a); err != nil {
		return nil, refuse("invalid arguments for %s (%v); %s", Name, err, shape)
	}
	if dec.More() {
		return nil, refuse("invalid arguments for %s: trailing data; %s", Name, shape)
	}
	if a.URL == "" {
		return nil, refuse(`invalid arguments for %s: "url" is required; %s`, Name, shape)
	}
	return &a, nil
}

var placeholder = regexp.MustCompile(`\{\{secret:([^{}]*)\}\}`)

// Placeholder matches a {{secret:NAME}} placeholder, the name its first
// group: the one spelling both of the vault's doors (this tool and the
// egress proxy) fill.
var Placeholder = placeholder

// SecretNames lists the distinct secret names a request's placeholders
// use, in order of first use.
func SecretNames(a *Args) []string {
	var out []string
	add := func(s string) {
		for _, m := range placeholder.FindAllStringSubmatch(s, -1) {
			if !slices.Contains(out, m[1]) {
				out = append(out, m[1])
			}
		}
	}
	add(a.URL)
	for _, k := range sortedKeys(a.Headers) {
		add(k)
		add(a.Headers[k])
	}
	if a.Body != nil {
		add(*a.Body)
	}
	return out
}

// Releaser asks the vault for secret name's value for one request to host.
// Its error's message is shown to the model; an *apierr.Error's status and
// reason are kept (any other error is a 502).
type Releaser func(ctx context.Context, name, host string) (string, error)

// Options configure a Tool. The zero value is the production setting.
type Options struct {
	Timeout      time.Duration
	MaxResponse  int64
	MaxRedirects int
	// ExtraRoots are trusted in addition to the system roots.
	ExtraRoots []*x509.Certificate
	// AllowLoopback lets requests reach 127.0.0.0/8 and ::1, so tests can
	// stand a loopback TLS server in for a bound host. Never set from
	// production configuration.
	AllowLoopback bool
	// Resolve, when set, maps a hostname to the address dialled (tests:
	// api.example.com → the loopback test server). The guard still checks
	// the address.
	Resolve func(host string) string
	// Proxy, when set, carries every request (CONNECT for https): the
	// daemon in a jail reaches the internet only through its egress relay,
	// which applies the public-address rule itself. The guard lets the
	// connection to the proxy's own address through, and nothing else.
	Proxy *url.URL
}

// Tool executes http_request calls.
type Tool struct {
	o      Options
	client *http.Client
}

// New returns a Tool.
func New(o Options) *Tool {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxResponse <= 0 {
		o.MaxResponse = DefaultMaxResponse
	}
	if o.MaxRedirects <= 0 {
		o.MaxRedirects = DefaultRedirects
	}
	g := newGuard(o.AllowLoopback)
	dialer := &net.Dialer{Timeout: 10 * time.Second, Control: g.control}
	tlsConf := safehttp.TLSConfig(o.ExtraRoots)
	dial := dialer.DialContext
	if o.Resolve != nil {
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			if to := o.Resolve(host); to != "" {
				addr = net.JoinHostPort(to, port)
			}
			return dialer.DialContext(ctx, network, addr)
		}
	}
	var proxy func(*http.Request) (*url.URL, error) // nil: a proxy would dial for us, past the guard
	if o.Proxy != nil {
		proxy = http.ProxyURL(o.Proxy)
		g.proxy = o.Proxy.Host
	}
	tr := &http.Transport{
		Proxy:                  proxy,
		DialContext:            dial,
		TLSClientConfig:        tlsConf,
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  o.Timeout,
		MaxResponseHeaderBytes: 64 << 10,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
	}
	return &Tool{o: o, client: &http.Client{Transport: tr,
		// Redirects are followed by Do, hop by hop, so that each hop is
		// checked for where released values may go.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Result is what the agent sees: released values replaced by their
// placeholders everywhere.
type Result struct {
	Status  int               `json:"status"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	// Body is the response body when it is UTF-8 text; BodyBase64 otherwise.
	Body       string   `json:"body,omitempty"`
	BodyBase64 string   `json:"body_base64,omitempty"`
	Truncated  bool     `json:"truncated,omitempty"`
	Redirects  []string `json:"redirects,omitempty"`
	Note       string   `json:"note,omitempty"`
}

var methods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// forbiddenHeaders are set by the transport, never by the agent.
var forbiddenHeaders = []string{"Host", "Content-Length", "Transfer-Encoding", "Connection", "Upgrade", "Te", "Trailer", "Proxy-Authorization", "Proxy-Connection", "Keep-Alive"}

// secretValue is one released value.
type secretValue struct {
	name  string
	value string
}

// Check validates a request's shape (method, URL, headers, bounds) before
// anything is released or sent; the daemon calls it before asking the
// caller's approval, so a request that could never go is not approved.
func Check(a *Args) error {
	_, _, err := check(a)
	return err
}

func check(a *Args) (string, *url.URL, error) {
	method := strings.ToUpper(a.Method)
	if method == "" {
		method = "GET"
	}
	if !slices.Contains(methods, method) {
		return "", nil, refuse("method %q is not supported: use one of %s", a.Method, strings.Join(methods, ", "))
	}
	raw := a.URL
	if len(raw) > MaxURL {
		return "", nil, refuse("the URL is longer than %d bytes", MaxURL)
	}
	if !strings.Contains(raw, "://") {
		raw = "https://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", nil, refuse("the URL does not parse: give an absolute https:// URL")
	}
	if u.Scheme != "https" {
		return "", nil, refuse("only https URLs are allowed (got %q): secrets and responses travel encrypted", u.Scheme)
	}
	if u.User != nil {
		return "", nil, refuse("URLs with user information (user:password@) are not allowed: put credentials in a header, e.g. Authorization with a {{secret:NAME}} placeholder")
	}
	if placeholder.MatchString(u.Host) || strings.Contains(u.Host, "{{") {
		return "", nil, refuse("a placeholder cannot be part of the host: name the host literally")
	}
	if u.Hostname() == "" {
		return "", nil, refuse("the URL has no host")
	}
	if len(a.Headers) > MaxHeaders {
		return "", nil, refuse("at most %d headers", MaxHeaders)
	}
	for k, v := range a.Headers {
		if slices.ContainsFunc(forbiddenHeaders, func(f string) bool { return strings.EqualFold(f, k) }) {
			return "", nil, refuse("header %q is set by the tool, not by you", k)
		}
		if len(k)+len(v) > MaxHeaderSize {
			return "", nil, refuse("header %q is longer than %d bytes", k, MaxHeaderSize)
		}
		if placeholder.MatchString(k) {
			return "", nil, refuse("a placeholder cannot be part of a header name (%q): put it in the value", k)
		}
	}
	if a.Body != nil && len(*a.Body) > MaxReqBody {
		return "", nil, apierr.New(http.StatusRequestEntityTooLarge, apierr.ReasonPayloadTooLarge, "the body is longer than %d bytes", MaxReqBody)
	}
	return method, u, nil
}

// Do executes the request. Refusals and failures are *apierr.Error (their
// messages for the model); their messages never hold a released value.
func (t *Tool) Do(ctx context.Context, a *Args, release Releaser) (*Result, error) {
	method, u, err := check(a)
	if err != nil {
		return nil, err
	}
	names := SecretNames(a)
	var secrets []secretValue
	host := u.Hostname()
	if len(names) > 0 {
		// The host the values are released for, by the vault's own rules:
		// redirects compare against it.
		if _, err := vaulthost.NormalizeHost(host); err != nil {
			// Still asked, so the vault records the refusal (invalid_host)
			// in its audit; it never releases for such a host.
			for _, n := range names {
				if v, rerr := release(ctx, n, host); rerr == nil && v != "" {
					return nil, apierr.Bug("the vault released secret %q for host %q, which is not a DNS hostname", n, host)
				}
			}
			return nil, refuse("secrets are only sent to DNS hostnames; %q is not one (%v)", host, err)
		}
		for _, n := range names {
			v, err := release(ctx, n, host)
			if err != nil {
				return nil, notReleased(n, host, err)
			}
			secrets = append(secrets, secretValue{name: n, value: v})
		}
	}
	fill := func(s string, escape func(string) string) string {
		return placeholder.ReplaceAllStringFunc(s, func(m string) string {
			n := placeholder.FindStringSubmatch(m)[1]
			for _, sv := range secrets {
				if sv.name == n {
					if escape != nil {
						return escape(sv.value)
					}
					return sv.value
				}
			}
			return m
		})
	}
	// The URL: path parts escaped as a path, query parts as a query.
	filled := *u
	if placeholder.MatchString(u.Path) {
		filled.Path, filled.RawPath = fill(u.Path, nil), ""
	}
	// Only literal braces are placeholders: a percent-encoded one was
	// not found by SecretNames either, so it goes out as written.
	filled.RawQuery = fill(u.RawQuery, url.QueryEscape)
	headers := http.Header{}
	secretHeaders := map[string]bool{}
	for _, k := range sortedKeys(a.Headers) {
		v := a.Headers[k]
		if placeholder.MatchString(v) {
			secretHeaders[http.CanonicalHeaderKey(k)] = true
		}
		headers.Set(k, fill(v, nil))
	}
	var body []byte
	bodySecret := false
	if a.Body != nil {
		bodySecret = placeholder.MatchString(*a.Body)
		body = []byte(fill(*a.Body, nil))
	}
	red := &Redactor{}
	for _, sv := range secrets {
		red.Add(sv.value, "{{secret:"+sv.name+"}}")
	}
	redact := red.Redact
	ctx, cancel := context.WithTimeout(ctx, t.o.Timeout)
	defer cancel()
	res := &Result{}
	boundHost, _ := vaulthost.NormalizeHost(host)
	cur := &filled
	for hop := 0; ; hop++ {
		req, err := http.NewRequestWithContext(ctx, method, cur.String(), bytes.NewReader(body))
		if err != nil {
			return nil, refuse("the request cannot be built: %s", redact(err.Error()))
		}
		if body == nil {
			req.Body, req.ContentLength = http.NoBody, 0
		}
		req.Header = headers.Clone()
		resp, err := t.client.Do(req)
		if err != nil {
			return nil, failed("the request failed", err, redact, false)
		}
		loc := resp.Header.Get("Location")
		redirect := resp.StatusCode == 301 || resp.StatusCode == 302 || resp.StatusCode == 303 || resp.StatusCode == 307 || resp.StatusCode == 308
		if !redirect || loc == "" {
			return t.finish(res, resp, cur, red)
		}
		next, err := cur.Parse(loc)
		if err != nil || next.Scheme != "https" || next.User != nil || hop+1 > t.o.MaxRedirects {
			res.Note = "the redirect was not followed: " + map[bool]string{true: fmt.Sprintf("more than %d redirects", t.o.MaxRedirects), false: "its target is not a plain https URL"}[err == nil && next.Scheme == "https" && next.User == nil]
			return t.finish(res, resp, cur, red)
		}
		resp.Body.Close()
		nextHost, _ := vaulthost.NormalizeHost(next.Hostname())
		sameHost := len(secrets) == 0 || (boundHost != "" && nextHost == boundHost)
		keepBody := resp.StatusCode == 307 || resp.StatusCode == 308
		if !keepBody {
			// 301, 302 and 303 continue as GET (HEAD stays HEAD), bodiless.
			if method != "HEAD" {
				method = "GET"
			}
			body, bodySecret = nil, false
		}
		if !sameHost {
			// Another host never receives a released value: not in the
			// URL the server chose, not in a header, not in the body.
			if redact(next.String()) != next.String() || (keepBody && bodySecret) {
				res.Redirects = append(res.Redirects, redact(next.String()))
				res.Note = fmt.Sprintf("the redirect to %s was not followed: it would carry a secret to a host it is not bound to", next.Hostname())
				return t.finishHeadersOnly(res, resp, cur, red)
			}
			for k := range secretHeaders {
				headers.Del(k)
			}
			boundHost = "" // released values stay behind from here on
		}
		res.Redirects = append(res.Redirects, redact(next.String()))
		cur = next
	}
}

// finish reads a bounded body and redacts.
func (t *Tool) finish(res *Result, resp *http.Response, u *url.URL, red *Redactor) (*Result, error) {
	defer resp.Body.Close()
	// Read past the bound by the longest spelling of a value, so an
	// occurrence that starts before the cut is whole when it is redacted.
	b, err := io.ReadAll(io.LimitReader(resp.Body, t.o.MaxResponse+int64(red.Longest())+1))
	if err != nil {
		return nil, failed("reading the response failed", err, red.Redact, true)
	}
	body := red.Redact(string(b))
	if int64(len(b)) > t.o.MaxResponse {
		res.Truncated = true
		cut := int(min(t.o.MaxResponse, int64(len(body))))
		for cut > 0 && cut < len(body) && !utf8.RuneStart(body[cut]) {
			cut--
		}
		// A value cut short at the end is not recognised by redact: drop
		// any tail that begins a spelling of one.
		body = red.ScrubTail(body[:cut])
	}
	t.fill(res, resp, u, red.Redact)
	if utf8.ValidString(body) {
		res.Body = body
	} else {
		res.BodyBase64 = base64.StdEncoding.EncodeToString([]byte(body))
	}
	return res, nil
}

func (t *Tool) finishHeadersOnly(res *Result, resp *http.Response, u *url.URL, red *Redactor) (*Result, error) {
	resp.Body.Close()
	t.fill(res, resp, u, red.Redact)
	return res, nil
}

func (t *Tool) fill(res *Result, resp *http.Response, u *url.URL, redact func(string) string) {
	res.Status = resp.StatusCode
	res.URL = redact(u.String())
	res.Headers = make(map[string]string, len(resp.Header))
	for k, vs := range resp.Header {
		res.Headers[k] = redact(strings.Join(vs, ", "))
	}
}

// cleanErr drops the method and quoted URL net/http puts in front of
// transport errors; what remains says what failed.
func cleanErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	return err.Error()
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
