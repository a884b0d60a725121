package federation_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cohort-dev/cohort/internal/federation"
)

// FuzzParseTokenForm: any body either parses into a request that obeys
// every field rule, or is refused with an OAuth error; it never panics.
// Seeds live in testdata/fuzz/FuzzParseTokenForm and run with go test.
func FuzzParseTokenForm(f *testing.F) {
	f.Add([]byte(exchangeForm("a.b.c", "p")))
	f.Add([]byte(exchangeForm("a.b.c", "p", "scope", "inference", "audience", "x", "audience", "y")))
	f.Add([]byte("grant_type=%zz&subject_token=%"))
	f.Add([]byte("&&&=&=="))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := federation.ParseTokenForm(body)
		if err != nil {
			var oe *federation.OAuthError
			if !asOAuthErr(err, &oe) || oe.Status != 400 || oe.Code == "" {
				t.Fatalf("error %v is not a 400 OAuth error", err)
			}
			return
		}
		if r.GrantType != federation.GrantTokenExchange || r.SubjectTokenType != federation.TokenTypeJWT ||
			r.SubjectToken == "" || len(r.SubjectToken) > federation.MaxSubjectToken || r.PolicyID == "" ||
			(r.Scope != "" && r.Scope != "inference") ||
			(r.RequestedTokenType != "" && r.RequestedTokenType != federation.TokenTypeAccessToken) {
			t.Fatalf("accepted a request breaking a rule: %+v", r)
		}
	})
}

func asOAuthErr(err error, target **federation.OAuthError) bool {
	e, ok := err.(*federation.OAuthError)
	*target = e
	return ok
}

// FuzzParseSubjectToken: the JWT pre-checks never panic; what they accept
// is a three-part token within 16 KB whose claims, once CheckLimits
// passes, are within the spec's bounds.
func FuzzParseSubjectToken(f *testing.F) {
	f.Add(b64([]byte(`{"alg":"RS256","kid":"k"}`)) + "." + b64([]byte(`{"sub":"a","aud":["b"],"scopes":["c"],"exp":1e10}`)) + ".c2ln")
	f.Add(b64([]byte(`{"alg":"none"}`)) + "." + b64([]byte(`{"sub":"a","SUB":"b"}`)) + ".")
	f.Add(b64([]byte(`{"alg":"ES256"}`)) + "." + b64([]byte(`{"sub":"a","sub":"b"}`)) + ".x")
	f.Add(strings.Repeat(".", 64))
	f.Add("a.b.c")
	f.Fuzz(func(t *testing.T, raw string) {
		tok, err := federation.ParseSubjectToken(raw)
		if err != nil {
			return
		}
		if len(raw) > federation.MaxSubjectToken || strings.Count(raw, ".") != 2 || !strings.HasPrefix(raw, tok.SigningInput+".") {
			t.Fatalf("accepted %q", raw)
		}
		if tok.Claims == nil || tok.Header == nil {
			t.Fatal("nil maps")
		}
		if tok.CheckLimits() != nil {
			return
		}
		if s, ok := tok.Claims["sub"].(string); ok && utf8.RuneCountInString(s) > federation.MaxSubLength {
			t.Fatalf("sub of %d characters passed", utf8.RuneCountInString(s))
		}
		if sc, ok := tok.Claims["scopes"].([]any); ok && len(sc) > federation.MaxScopes {
			t.Fatalf("%d scopes passed", len(sc))
		}
	})
}
