package federation

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Bounds on the subject token (spec: Limits).
const (
	MaxSubjectToken = 16 << 10 // bytes
	MaxSubLength    = 512      // characters of sub
	MaxAudLength    = 512      // characters of each aud value
	MaxScopes       = 16       // entries of scopes
	MaxScopeLength  = 512      // characters of each scopes entry
)

// SubjectToken is a subject token split and decoded, not yet verified. Its
// claims are decoded once, into one map: every later check (the exact
// iss/aud/sub checks, the claim checks and the CEL variables) reads that
// same map, so no two checks can see different values of a claim.
type SubjectToken struct {
	Header map[string]any
	Claims map[string]any
	// Alg and Kid are the header's alg and kid ("" when absent or not a
	// string).
	Alg, Kid string
	// SigningInput is "header.payload", what the signature covers.
	SigningInput string
	Signature    []byte
}

var b64 = base64.RawURLEncoding.Strict()

// errNotJWT is the structural failure: the spec answers it with
// invalid_request (the token is not a JWT), not invalid_grant.
var errNotJWT = errors.New("subject_token is not a JWT")

// ParseSubjectToken splits a compact JWS and decodes its header and claims.
// It refuses, cheaply and before any decoding, a token longer than 16 KB or
// without exactly three segments; then non-canonical base64url, a header
// or claims set that is not one JSON object, and duplicate member names
// (RFC 7519 §4: a parser must reject them or keep the last; we reject, so
// no other reader of the same token can disagree with us).
func ParseSubjectToken(raw string) (*SubjectToken, error) {
	if len(raw) > MaxSubjectToken {
		return nil, fmt.Errorf("%w: longer than %d bytes", errNotJWT, MaxSubjectToken)
	}
	if strings.Count(raw, ".") != 2 {
		return nil, fmt.Errorf("%w: want three dot-separated segments", errNotJWT)
	}
	h, rest, _ := strings.Cut(raw, ".")
	p, s, _ := strings.Cut(rest, ".")
	if h == "" || p == "" {
		return nil, fmt.Errorf("%w: empty header or payload", errNotJWT)
	}
	hb, err := b64.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("%w: header is not base64url", errNotJWT)
	}
	pb, err := b64.DecodeString(p)
	if err != nil {
		return nil, fmt.Errorf("%w: payload is not base64url", errNotJWT)
	}
	sig, err := b64.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: signature is not base64url", errNotJWT)
	}
	header, err := decodeObject(hb)
	if err != nil {
		return nil, fmt.Errorf("%w: header: %v", errNotJWT, err)
	}
	claims, err := decodeObject(pb)
	if err != nil {
		return nil, fmt.Errorf("%w: claims: %v", errNotJWT, err)
	}
	t := &SubjectToken{Header: header, Claims: claims, SigningInput: raw[:len(h)+1+len(p)], Signature: sig}
	t.Alg, _ = header["alg"].(string)
	t.Kid, _ = header["kid"].(string)
	return t, nil
}

// CheckLimits applies the spec's size bounds, which come before any rule:
// sub and each aud value at most 512 characters, scopes at most 16
// entries of at most 512 characters. A claim of another type is not sized
// here; the check that reads it refuses the type.
func (t *SubjectToken) CheckLimits() error {
	if sub, ok := t.Claims["sub"].(string); ok {
		if n := utf8.RuneCountInString(sub); n > MaxSubLength {
			return fmt.Errorf("sub is %d characters, more than %d", n, MaxSubLength)
		}
	}
	switch aud := t.Claims["aud"].(type) {
	case string:
		if n := utf8.RuneCountInString(aud); n > MaxAudLength {
			return fmt.Errorf("aud is %d characters, more than %d", n, MaxAudLength)
		}
	case []any:
		for i, a := range aud {
			if s, ok := a.(string); ok {
				if n := utf8.RuneCountInString(s); n > MaxAudLength {
					return fmt.Errorf("aud[%d] is %d characters, more than %d", i, n, MaxAudLength)
				}
			}
		}
	}
	if scopes, ok := t.Claims["scopes"].([]any); ok {
		if len(scopes) > MaxScopes {
			return fmt.Errorf("scopes has %d entries, more than %d", len(scopes), MaxScopes)
		}
		for i, sc := range scopes {
			if s, ok := sc.(string); ok {
				if n := utf8.RuneCountInString(s); n > MaxScopeLength {
					return fmt.Errorf("scopes[%d] is %d characters, more than %d", i, n, MaxScopeLength)
				}
			}
		}
	}
	return nil
}

// stringClaim returns a string claim; present reports whether the claim
// exists at all, ok whether it is a string.
func (t *SubjectToken) stringClaim(name string) (v string, present, ok bool) {
	raw, present := t.Claims[name]
	if !present {
		return "", false, false
	}
	v, ok = raw.(string)
	return v, true, ok
}

// audience returns aud as a list: a string becomes a one-element list.
// ok is false when aud is absent, empty, or not a string or array of
// strings.
func (t *SubjectToken) audience() ([]string, bool) {
	switch aud := t.Claims["aud"].(type) {
	case string:
		return []string{aud}, aud != ""
	case []any:
		out := make([]string, len(aud))
		for i, a := range aud {
			s, ok := a.(string)
			if !ok {
				return nil, false
			}
			out[i] = s
		}
		return out, len(out) > 0
	}
	return nil, false
}

// scopes returns the scopes claim: an empty list when absent, ok false
// when it is present but not an array of strings (a space-separated
// string included: the spec does not use it).
func (t *SubjectToken) scopes() ([]string, bool) {
	raw, present := t.Claims["scopes"]
	if !present {
		return []string{}, true
	}
	arr, ok := raw.([]any)
	if !ok {
		return nil, false
	}
	out := make([]string, len(arr))
	for i, a := range arr {
		s, ok := a.(string)
		if !ok {
			return nil, false
		}
		out[i] = s
	}
	return out, true
}

// tokenType returns the token_type claim: "" when absent, ok false when
// it is not a string.
func (t *SubjectToken) tokenType() (string, bool) {
	v, present, ok := t.stringClaim("token_type")
	if !present {
		return "", true
	}
	return v, ok
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary so a stored detail stays valid UTF-8.
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
