package federation

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/cohort-dev/cohort/internal/rest"
)

// awkward are strings whose JSON encoding has every special case: quotes,
// backslashes, control characters, HTML characters, U+2028/U+2029,
// invalid UTF-8 and multi-byte runes.
var awkward = []string{
	"", "cohort", "https://idp.example/tenant?a=1&b=<2>", `say "hi" \ bye`, "tab\tnl\nret\rbs\bff\f\x00\x1f\x7f",
	"line\u2028para\u2029", "bad\xffutf8\xc3", "\xe2\x80", "日本語 ✓ 🙂", "repo:acme/app:ref:refs/heads/main",
}

// TestAppendClaimsIsJSONMarshal: the hand-written claims are the bytes
// json.Marshal writes for the same accessClaims, and VerifyAccessToken's
// decoding reads them back.
func TestAppendClaimsIsJSONMarshal(t *testing.T) {
	iat := time.Unix(1_900_000_000, 0)
	for _, s := range awkward {
		for _, issuer := range []string{"cohort", s} {
			g := &accessGrant{issuer: issuer, subject: s, id: s, issuedAt: iat.Unix(), expiresAt: iat.Unix() + 900,
				clientID: s, policyID: s + "p", issuerID: "i" + s}
			want, err := json.Marshal(&accessClaims{
				RegisteredClaims: jwt.RegisteredClaims{Issuer: issuer, Subject: s, Audience: jwt.ClaimStrings{issuer},
					IssuedAt: jwt.NewNumericDate(iat), ExpiresAt: jwt.NewNumericDate(iat.Add(900 * time.Second)), ID: s},
				ClientID: s, Scope: scopeInference, FederationPolicyID: s + "p", FederationIssuerID: "i" + s,
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := g.appendClaims(nil); !bytes.Equal(got, want) {
				t.Errorf("claims for %q:\n got %s\nwant %s", s, got, want)
			}
		}
	}
}

// TestAccessTokenHeader: the header is golang-jwt's for the same token.
func TestAccessTokenHeader(t *testing.T) {
	for _, kid := range append(awkward, "0193a3f0-7c1e-7b1a-9f3e-2a4b5c6d7e8f") {
		tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{})
		tok.Header["typ"] = accessTokenType
		tok.Header["kid"] = kid
		h, err := json.Marshal(tok.Header)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := accessTokenHeader(kid), tok.EncodeSegment(h); got != want {
			t.Errorf("header for kid %q: got %s, want %s", kid, got, want)
		}
	}
}

// TestWriteExchangeResultIsWriteJSON: the answer is the bytes and headers
// rest.WriteJSON writes.
func TestWriteExchangeResultIsWriteJSON(t *testing.T) {
	for _, s := range awkward {
		res := &ExchangeResult{AccessToken: "a.b.c" + s, IssuedTokenType: TokenTypeAccessToken, TokenType: "Bearer",
			ExpiresIn: 899, Scope: scopeInference + s}
		got, want := httptest.NewRecorder(), httptest.NewRecorder()
		writeExchangeResult(got, res)
		rest.WriteJSON(want, 200, res)
		if got.Code != want.Code || got.Body.String() != want.Body.String() ||
			got.Header().Get("Content-Type") != want.Header().Get("Content-Type") {
			t.Errorf("answer for %q:\n got %d %v %s\nwant %d %v %s", s, got.Code, got.Header(), got.Body, want.Code, want.Header(), want.Body)
		}
	}
}

// FuzzAppendJSONString: any string encodes as json.Marshal encodes it.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range awkward {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("%q: got %s, want %s", s, got, want)
		}
	})
}
