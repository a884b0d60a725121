package vault_test

import (
	"net/url"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// FuzzPutSecret: whatever the body, name and Content-Type, storing a
// secret answers 200/201 or a 4xx in the family's shape; never a 5xx.
func FuzzPutSecret(f *testing.F) {
	for _, seed := range [][3]string{
		{"token", `{"hosts":["api.example.com"],"value":"v"}`, "application/json"},
		{"token", `{"hosts":["api.example.com","*.x.com"],"value":"\ud83d\ude00"}`, ""},
		{"bad name", `{"hosts":["a.com"],"value":"v"}`, "application/json"},
		{"t", `{"hosts":["10.0.0.1"],"value":"v"}`, "application/json"},
		{"t", `{"hosts":[],"value":""}`, "application/json"},
		{"t", `{"hosts":"a.com","value":1}`, "application/json"},
		{"t", `{"value":"\udc00"}`, "application/json"},
		{"t", `{"hosts":["a.com"],"value":"v"}`, "application/x-www-form-urlencoded"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	e := testenv.New(f, storetest.SQLite(f))
	f.Fuzz(func(t *testing.T, name, body, ct string) {
		if !testenv.SendableHeader(ct) {
			t.Skip()
		}
		status, resp, _ := e.Do(t, "PUT", "/vault/interns/"+e.InternID+"/secrets/"+pathSegment(name), e.WorkspaceKey, ct, body)
		switch {
		case status == 200 || status == 201:
		case status >= 400 && status < 500:
			if err := testenv.ErrorShape(status, resp); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("status %d for %q %q (%q): %s", status, name, body, ct, resp)
		}
	})
}

// pathSegment escapes a fuzzed name into one URL path segment.
func pathSegment(s string) string {
	if s == "" || s == "." || s == ".." {
		return "x"
	}
	return url.PathEscape(s)
}
