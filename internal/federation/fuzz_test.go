package federation_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// FuzzTokenEndpoint: whatever the form and its Content-Type, the token
// endpoint answers an RFC 6749 error body ({"error": code[,
// "error_description": text]}) with no-store headers, or a token; never a
// 5xx other than 503 temporarily_unavailable.
func FuzzTokenEndpoint(f *testing.F) {
	p := newIDP(f)
	fd := newFed(f, storetest.SQLite(f), p)
	good := p.token(f, kidRSA, p.claims())
	for _, seed := range [][2]string{
		{exchangeForm(good, fd.policyID), "application/x-www-form-urlencoded"},
		{exchangeForm(good, fd.policyID), "application/json"},
		{"grant_type=client_credentials", "application/x-www-form-urlencoded"},
		{exchangeForm("a.b.c", fd.policyID), "application/x-www-form-urlencoded"},
		{exchangeForm(good, fd.policyID) + "&subject_token=x", "application/x-www-form-urlencoded"},
		{"%zz=1", "application/x-www-form-urlencoded"},
		{"", ""},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, body, ct string) {
		if !testenv.SendableHeader(ct) {
			t.Skip()
		}
		status, resp, h := fd.Do(t, http.MethodPost, "/oauth/token", "", ct, body)
		if h.Get("Cache-Control") != "no-store" {
			t.Fatalf("%d without no-store: %s", status, resp)
		}
		var out map[string]any
		if err := json.Unmarshal([]byte(resp), &out); err != nil {
			t.Fatalf("%d: body is not JSON: %q", status, resp)
		}
		switch {
		case status == http.StatusOK:
			if _, ok := out["access_token"].(string); !ok {
				t.Fatalf("200 without a token: %s", resp)
			}
		case status >= 400 && status < 500, status == http.StatusServiceUnavailable:
			code, ok := out["error"].(string)
			if !ok || code == "" || len(out) > 2 {
				t.Fatalf("%d: not an RFC 6749 error body: %s", status, resp)
			}
			if d, has := out["error_description"]; has {
				if _, ok := d.(string); !ok {
					t.Fatalf("%d: error_description %v", status, d)
				}
			}
		default:
			t.Fatalf("status %d for %q (%q): %s", status, body, ct, resp)
		}
	})
}
