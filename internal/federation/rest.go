package federation

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/cohort-dev/cohort/internal/accesslog"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/relayctx"
	"github.com/cohort-dev/cohort/internal/rest"
)

// REST is the REST door: POST /oauth/token and GET /oauth/jwks.
type REST struct{ S *Service }

// writeOAuth writes err as an RFC 6749 §5.2 error body. An *apierr.Error
// whose reason is an OAuth error code goes as it is: its status, the reason
// as "error", the message as "error_description", Retry-After. Anything else
// (an outage, a bug) is logged with its cause and answered 500 server_error
// "internal error".
func writeOAuth(w http.ResponseWriter, r *http.Request, err error) {
	e := apierr.From(err)
	if e.Reason == apierr.ReasonUnavailable {
		// The database is unavailable: RFC 6749's temporarily_unavailable,
		// with when to retry.
		accesslog.LogFault(r, e)
		e = apierr.New(http.StatusServiceUnavailable, ReasonTemporarilyUnavailable, "%s", e.Message).Retry(e.RetryAfter)
	} else if !oauthReasons[e.Reason] {
		accesslog.LogFault(r, e)
		e = apierr.New(http.StatusInternalServerError, ReasonServerError, "internal error")
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	body, _ := json.Marshal(struct {
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}{string(e.Reason), e.Message})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	w.Write(append(body, '\n'))
}

// sourceAddress is the caller's address, and the key it is rate limited
// by: the IP for IPv4, its /64 for IPv6 (one host usually holds a whole
// /64, so a per-address limit on IPv6 would limit nothing); for a request
// that came through an intern's jail relay (every one from 127.0.0.1), the
// intern, so one intern cannot use up the others' budget, nor a loopback
// client's.
func sourceAddress(r *http.Request) (addr, limitKey string) {
	addr, limitKey = networkAddress(r)
	if id, ok := relayctx.Intern(r.Context()); ok {
		return addr, "intern:" + id
	}
	return addr, limitKey
}

func networkAddress(r *http.Request) (addr, limitKey string) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host, host
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return ip.String(), p.String()
	}
	return ip.String(), ip.String()
}

// Token handles POST /oauth/token (RFC 8693). Every answer carries
// Cache-Control: no-store and Pragma: no-cache (RFC 6749 §5.1).
func (h REST) Token(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeOAuth(w, r, apierr.New(http.StatusMethodNotAllowed, ReasonInvalidRequest, "use POST"))
		return
	}
	if r.ContentLength > MaxTokenBody {
		rest.Drain(w, r.Body)
		writeOAuth(w, r, errBodyTooLarge)
		return
	}
	// A form is small: an encoded one is refused, never parsed as if plain.
	if enc := strings.TrimSpace(r.Header.Get("Content-Encoding")); enc != "" && !strings.EqualFold(enc, "identity") {
		writeOAuth(w, r, invalidRequest("Content-Encoding is not supported here: send the form as is"))
		return
	}
	body, err := readBody(http.MaxBytesReader(w, r.Body, MaxTokenBody), r.ContentLength)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			rest.Drain(w, r.Body)
			writeOAuth(w, r, errBodyTooLarge)
			return
		}
		writeOAuth(w, r, invalidRequest("the body could not be read"))
		return
	}
	if err := checkFormContentType(r.Header.Get("Content-Type")); err != nil {
		writeOAuth(w, r, err)
		return
	}
	req, err := parseTokenForm(body)
	if err != nil {
		writeOAuth(w, r, err)
		return
	}
	addr, key := sourceAddress(r)
	ok, retry, err := h.S.settings().Limiter.Allow(r.Context(), key)
	if err != nil {
		// A limiter outage must not stop every workload: exchanges go on
		// unlimited, and the log says so.
		h.S.log().ErrorContext(r.Context(), "federation: exchange rate limiter failed; allowing", "err", err)
	} else if !ok {
		from := "address"
		if _, relayed := relayctx.Intern(r.Context()); relayed {
			from = "intern"
		}
		e := apierr.New(http.StatusTooManyRequests, ReasonInvalidRequest, "too many token exchanges from this %s; retry later", from)
		e.RetryAfter = max(1, int(math.Ceil(retry.Seconds())))
		writeOAuth(w, r, e)
		return
	}
	res, err := h.S.Exchange(r.Context(), req, addr)
	if err != nil {
		writeOAuth(w, r, err)
		return
	}
	writeExchangeResult(w, res)
}

var errBodyTooLarge = apierr.New(http.StatusRequestEntityTooLarge, ReasonInvalidRequest,
	"the body must be under 32 KB (at most 32767 bytes)")

// readChunks are the buffers bodies are read through.
var readChunks = sync.Pool{New: func() any { return new([2048]byte) }}

// readBody reads the whole body into one string of the announced size
// (bounded by the caller's limit), which the parsed form's values then
// share: no second copy of the body for them.
func readBody(body io.Reader, announced int64) (string, error) {
	var b strings.Builder
	b.Grow(int(max(0, min(announced, MaxTokenBody))))
	chunk := readChunks.Get().(*[2048]byte)
	defer readChunks.Put(chunk)
	for {
		n, err := body.Read(chunk[:])
		b.Write(chunk[:n])
		if err == io.EOF {
			return b.String(), nil
		}
		if err != nil {
			return "", err
		}
	}
}

// answerBufs are the buffers exchange answers are built in.
var answerBufs = sync.Pool{New: func() any { return new([]byte) }}

// writeExchangeResult writes the exchange's answer as rest.WriteJSON
// would (the same bytes), appended by hand: encoding/json's reflection
// cost more than the rest of the answer.
func writeExchangeResult(w http.ResponseWriter, res *ExchangeResult) {
	buf := answerBufs.Get().(*[]byte)
	b := append((*buf)[:0], '{')
	b = appendJSONMember(b, "access_token", res.AccessToken)
	b = appendJSONMember(b, "issued_token_type", res.IssuedTokenType)
	b = appendJSONMember(b, "token_type", res.TokenType)
	b = appendJSONInt(b, "expires_in", res.ExpiresIn)
	b = appendJSONMember(b, "scope", res.Scope)
	b = append(b, '}', '\n')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(b) // a Writer does not keep b
	*buf = b
	answerBufs.Put(buf)
}

// jwk is one published public key (RFC 7517/7518).
type jwk struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
}

// JWKS handles GET /oauth/jwks: every key that verifies a live access
// token, and the next key once it is pre-published. It is public, like any
// JWKS: public keys are not secret, and resource servers that verify our
// tokens hold no API key.
func (h REST) JWKS(w http.ResponseWriter, r *http.Request) {
	keys, err := h.S.signer.published(r.Context())
	if err != nil {
		rest.WriteError(w, r, apierr.Internal(err), false)
		return
	}
	out := struct {
		Keys []jwk `json:"keys"`
	}{Keys: []jwk{}}
	for _, k := range keys {
		raw, err := k.pub.Bytes() // 0x04 || X || Y, each 32 bytes
		if err != nil {
			// Every key was parsed as a P-256 point when it was loaded.
			rest.WriteError(w, r, apierr.Bug("signing key %s does not encode: %w", k.id, err), false)
			return
		}
		out.Keys = append(out.Keys, jwk{Kty: "EC", Crv: "P-256",
			X: base64.RawURLEncoding.EncodeToString(raw[1:33]), Y: base64.RawURLEncoding.EncodeToString(raw[33:65]),
			Kid: k.id, Alg: "ES256", Use: "sig"})
	}
	// Short enough that a verifier meets a pre-published key long before
	// it signs (KeyPrepublish is hours).
	w.Header().Set("Cache-Control", "public, max-age=300")
	rest.WriteJSON(w, http.StatusOK, out)
}
