package federation

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/httpx"
)

// REST is the REST door: POST /oauth/token and GET /oauth/jwks.
type REST struct{ S *Service }

// writeOAuth writes an RFC 6749 §5.2 error body.
func writeOAuth(w http.ResponseWriter, e *OAuthError) {
	if e.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfterSeconds))
	}
	body, _ := json.Marshal(struct {
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}{e.Code, e.Description})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	w.Write(append(body, '\n'))
}

// sourceAddress is the caller's address, and the key it is rate limited
// by: the IP for IPv4, its /64 for IPv6 (one host usually holds a whole
// /64, so a per-address limit on IPv6 would limit nothing).
func sourceAddress(r *http.Request) (addr, limitKey string) {
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
		writeOAuth(w, &OAuthError{Status: http.StatusMethodNotAllowed, Code: "invalid_request", Description: "use POST"})
		return
	}
	tooLarge := &OAuthError{Status: http.StatusRequestEntityTooLarge, Code: "invalid_request",
		Description: "the body must be under 32 KB (at most 32767 bytes)"}
	if r.ContentLength > MaxTokenBody {
		httpx.Drain(w, r.Body)
		writeOAuth(w, tooLarge)
		return
	}
	// A form is small: an encoded one is refused, never parsed as if plain.
	if enc := strings.TrimSpace(r.Header.Get("Content-Encoding")); enc != "" && !strings.EqualFold(enc, "identity") {
		writeOAuth(w, invalidRequest("Content-Encoding is not supported here: send the form as is"))
		return
	}
	// One allocation of the announced size (bounded above), not
	// io.ReadAll's doubling.
	buf := bytes.NewBuffer(make([]byte, 0, max(512, min(r.ContentLength, MaxTokenBody)+1)))
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, MaxTokenBody))
	body := buf.Bytes()
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			httpx.Drain(w, r.Body)
			writeOAuth(w, tooLarge)
			return
		}
		writeOAuth(w, invalidRequest("the body could not be read"))
		return
	}
	if err := checkFormContentType(r.Header.Get("Content-Type")); err != nil {
		writeOAuth(w, asOAuth(err))
		return
	}
	req, err := ParseTokenForm(body)
	if err != nil {
		writeOAuth(w, asOAuth(err))
		return
	}
	addr, key := sourceAddress(r)
	ok, retry, err := h.S.settings().Limiter.Allow(r.Context(), key)
	if err != nil {
		// A limiter outage must not stop every workload: exchanges go on
		// unlimited, and the log says so.
		h.S.log().ErrorContext(r.Context(), "federation: exchange rate limiter failed; allowing", "err", err)
	} else if !ok {
		writeOAuth(w, &OAuthError{Status: http.StatusTooManyRequests, Code: "invalid_request",
			Description:       "too many token exchanges from this address; retry later",
			RetryAfterSeconds: max(1, int(math.Ceil(retry.Seconds())))})
		return
	}
	res, err := h.S.Exchange(r.Context(), req, addr)
	if err != nil {
		if oe := asOAuth(err); oe != nil {
			writeOAuth(w, oe)
			return
		}
		e := apierr.From(err)
		httpx.LogFault(r, e)
		writeOAuth(w, &OAuthError{Status: http.StatusInternalServerError, Code: "server_error", Description: "internal error"})
		return
	}
	httpx.WriteJSON(w, http.StatusOK, res)
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
		httpx.WriteError(w, r, apierr.Internal(err), false)
		return
	}
	out := struct {
		Keys []jwk `json:"keys"`
	}{Keys: []jwk{}}
	for _, k := range keys {
		raw, err := k.pub.Bytes() // 0x04 || X || Y, each 32 bytes
		if err != nil {
			httpx.WriteError(w, r, apierr.Internal(err), false)
			return
		}
		out.Keys = append(out.Keys, jwk{Kty: "EC", Crv: "P-256",
			X: base64.RawURLEncoding.EncodeToString(raw[1:33]), Y: base64.RawURLEncoding.EncodeToString(raw[33:65]),
			Kid: k.id, Alg: "ES256", Use: "sig"})
	}
	// Short enough that a verifier meets a pre-published key long before
	// it signs (KeyPrepublish is hours).
	w.Header().Set("Cache-Control", "public, max-age=300")
	httpx.WriteJSON(w, http.StatusOK, out)
}
