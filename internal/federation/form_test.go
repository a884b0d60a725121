package federation_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/federation"
)

// paddedToken returns a valid RS256 token of exactly n bytes, padding the
// header and the claims.
func paddedToken(t *testing.T, p *idp, n int) string {
	t.Helper()
	for hp := 0; hp < 4; hp++ {
		header := mustJSON(map[string]any{"alg": "RS256", "kid": kidRSA, "x": strings.Repeat("h", hp)})
		c := p.claims()
		c["pad"] = ""
		base := len(sign(t, header, mustJSON(c), rsaKey))
		for extra := (n - base) * 3 / 4; extra >= 0 && extra < n; extra++ {
			c["pad"] = strings.Repeat("p", extra)
			tok := sign(t, header, mustJSON(c), rsaKey)
			if len(tok) == n {
				return tok
			}
			if len(tok) > n {
				break
			}
		}
	}
	t.Fatalf("no token of exactly %d bytes", n)
	return ""
}

func TestExchangeFormRules(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		good := p.token(t, kidRSA, p.claims())
		g, stt, st, pid := federation.GrantTokenExchange, federation.TokenTypeJWT, good, f.policyID
		f.Server.Federation.FlushAudit(context.Background())
		before := count(t, db, "federation_exchanges")

		for _, tc := range []struct {
			name, body string
			status     int
			code       string
		}{
			{"empty body", "", 400, "invalid_request"},
			{"grant_type missing", form("subject_token_type", stt, "subject_token", st, "federation_policy_id", pid), 400, "invalid_request"},
			{"grant_type empty counts as missing", form("grant_type", "", "subject_token_type", stt, "subject_token", st, "federation_policy_id", pid), 400, "invalid_request"},
			{"grant_type other", form("grant_type", "client_credentials", "subject_token_type", stt, "subject_token", st, "federation_policy_id", pid), 400, "unsupported_grant_type"},
			{"grant_type twice", form("grant_type", g, "grant_type", g, "subject_token_type", stt, "subject_token", st, "federation_policy_id", pid), 400, "invalid_request"},
			{"subject_token missing", form("grant_type", g, "subject_token_type", stt, "federation_policy_id", pid), 400, "invalid_request"},
			{"subject_token twice", form("grant_type", g, "subject_token_type", stt, "subject_token", st, "subject_token", st, "federation_policy_id", pid), 400, "invalid_request"},
			{"subject_token_type missing", form("grant_type", g, "subject_token", st, "federation_policy_id", pid), 400, "invalid_request"},
			{"subject_token_type other", form("grant_type", g, "subject_token_type", "urn:ietf:params:oauth:token-type:id_token", "subject_token", st, "federation_policy_id", pid), 400, "invalid_request"},
			{"federation_policy_id missing", form("grant_type", g, "subject_token_type", stt, "subject_token", st), 400, "invalid_request"},
			{"federation_policy_id too long", form("grant_type", g, "subject_token_type", stt, "subject_token", st, "federation_policy_id", strings.Repeat("a", 65)), 400, "invalid_request"},
			{"requested_token_type other", exchangeForm(st, pid, "requested_token_type", "urn:ietf:params:oauth:token-type:jwt"), 400, "invalid_request"},
			{"scope other", exchangeForm(st, pid, "scope", "admin"), 400, "invalid_scope"},
			{"scope with inference and more", exchangeForm(st, pid, "scope", "inference admin"), 400, "invalid_scope"},
			{"not a JWT: two segments", exchangeForm("abc.def", pid), 400, "invalid_request"},
			{"not a JWT: not base64", exchangeForm("a*b.c*d.e", pid), 400, "invalid_request"},
			{"not a JWT: header not JSON", exchangeForm(b64([]byte("nope"))+"."+b64([]byte("{}"))+".", pid), 400, "invalid_request"},
			{"not a JWT: claims an array", exchangeForm(b64([]byte(`{"alg":"RS256"}`))+"."+b64([]byte("[1]"))+".", pid), 400, "invalid_request"},
			{"not a JWT: duplicate claim", exchangeForm(sign(t, `{"alg":"RS256","kid":"rsa-1"}`, `{"sub":"a","sub":"b"}`, rsaKey), pid), 400, "invalid_request"},
			{"not a JWT: padded base64", exchangeForm(strings.Split(good, ".")[0]+"=."+strings.Split(good, ".")[1]+"."+strings.Split(good, ".")[2], pid), 400, "invalid_request"},
			{"bad percent-encoding", "grant_type=%zz", 400, "invalid_request"},
		} {
			a := f.post(t, tc.body)
			if a.status != tc.status || oauthErr(t, a) != tc.code {
				t.Errorf("%s: %d %s, want %d %s", tc.name, a.status, a.body, tc.status, tc.code)
			}
			noStore(t, a)
		}
		// Wrong content type, wrong method.
		status, body, h := f.Do(t, http.MethodPost, "/oauth/token", "", "application/json", exchangeForm(good, pid))
		expectError(t, answer{status, body, h}, 400, "invalid_request")
		status, body, h = f.Do(t, http.MethodGet, "/oauth/token", "", "", "")
		expectError(t, answer{status, body, h}, 405, "invalid_request")
		// A charset parameter is fine.
		status, body, _ = f.Do(t, http.MethodPost, "/oauth/token", "", "application/x-www-form-urlencoded; charset=UTF-8", exchangeForm(good, pid))
		if status != 200 {
			t.Fatalf("with charset: %d %s", status, body)
		}

		// subject_token: 16384 bytes is accepted, 16385 refused.
		at := paddedToken(t, p, federation.MaxSubjectToken)
		issued(t, f.exchange(t, at))
		past := paddedToken(t, p, federation.MaxSubjectToken+1)
		a := f.exchange(t, past)
		expectError(t, a, 400, "invalid_request")
		if !strings.Contains(a.body, "16384") {
			t.Errorf("16385-byte token: %s", a.body)
		}

		// Body under 32 KB: 32767 bytes accepted, 32768 refused with 413,
		// whether or not Content-Length is sent.
		fill := func(n int) string {
			b := exchangeForm(good, pid) + "&pad="
			return b + strings.Repeat("x", n-len(b))
		}
		if body := fill(federation.MaxTokenBody); len(body) != 32767 {
			t.Fatalf("fill: %d", len(body))
		}
		issued(t, f.post(t, fill(32767)))
		expectError(t, f.post(t, fill(32768)), 413, "invalid_request")
		chunked := func(body string) answer {
			req, _ := http.NewRequest(http.MethodPost, f.URL+"/oauth/token", io.MultiReader(strings.NewReader(body)))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			res, err := f.HTTPClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			return answer{res.StatusCode, string(b), res.Header}
		}
		issued(t, chunked(fill(32767)))
		expectError(t, chunked(fill(32768)), 413, "invalid_request")
		// A 1 MB token of dots is refused on its size, before parsing.
		start := time.Now()
		expectError(t, f.post(t, exchangeForm(strings.Repeat(".", 1<<20), pid)), 413, "invalid_request")
		if d := time.Since(start); d > time.Second {
			t.Errorf("1 MB body took %v", d)
		}

		// None of the refused requests wrote anything; the four issued
		// exchanges wrote one audit row each.
		f.Server.Federation.FlushAudit(context.Background())
		if n := count(t, db, "federation_exchanges"); n != before+4 {
			t.Fatalf("audit rows: %d, want %d (refused forms must write nothing)", n, before+4)
		}
	})
}

// TestParseSubjectTokenCheap: a megabyte of dots, or a token far over the
// bound, is refused on its length before any splitting or decoding.
func TestParseSubjectTokenCheap(t *testing.T) {
	dots := strings.Repeat(".", 1<<20)
	allocs := testing.AllocsPerRun(10, func() {
		if _, err := federation.ParseSubjectToken(dots); err == nil {
			t.Fatal("accepted")
		}
	})
	if allocs > 3 {
		t.Fatalf("%v allocations to refuse 1 MB of dots", allocs)
	}
	if _, err := federation.ParseSubjectToken(strings.Repeat(".", 100)); err == nil {
		t.Fatal("100 dots accepted")
	}
}

func TestParseTokenFormUnit(t *testing.T) {
	t.Parallel()
	r, err := federation.ParseTokenForm([]byte(exchangeForm("a.b.c", "p", "scope", "", "unknown", "x", "audience", "1", "audience", "2") + "&&flag"))
	if err != nil {
		t.Fatal(err)
	}
	if r.SubjectToken != "a.b.c" || r.PolicyID != "p" || r.Scope != "" {
		t.Fatalf("%+v", r)
	}
	// '+' is a space, as in every form.
	r, err = federation.ParseTokenForm([]byte(exchangeForm("a.b.c", "p") + "&requested_token_type=urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Aaccess_token"))
	if err != nil || r.RequestedTokenType != federation.TokenTypeAccessToken {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := federation.ParseTokenForm([]byte(exchangeForm("a.b.c", "p", "scope", "in+ference"))); err == nil {
		t.Fatal("scope 'in ference' accepted")
	}
}
