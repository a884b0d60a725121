package openapitest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// answer is what the fake gateway writes for one request.
type answer struct {
	status      int
	contentType string
	body        string
}

// check sends method path to a server that answers a, through a
// Transport over the committed document, and returns what it reported
// and the body the caller read.
func check(t *testing.T, method, path string, a answer) (reports []string, body string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.contentType != "" {
			w.Header().Set("Content-Type", a.contentType)
		}
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
	}))
	t.Cleanup(srv.Close)
	c, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &Transport{Base: http.DefaultTransport, Checker: c,
		For: func(*http.Request) func(string) { return func(m string) { reports = append(reports, m) } }}}
	req, _ := http.NewRequest(method, srv.URL+path, nil)
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return reports, string(b)
}

const secret = `{"name":"gh_token","hosts":["api.github.com"],"fingerprint":"sha256:ab12","created_at":"2026-11-29T00:00:00Z"}`

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, method, path string
		a                  answer
		want               string // a part of the report; "" for none
	}{
		{"a documented answer", "PUT", "/api/v1/vault/secrets/gh_token", answer{201, "application/json", secret}, ""},
		{"a renamed field", "PUT", "/api/v1/vault/secrets/gh_token", answer{201, "application/json", strings.Replace(secret, `"fingerprint"`, `"fingerprnt"`, 1)}, "fingerprint"},
		{"an undeclared status", "PUT", "/api/v1/vault/secrets/gh_token", answer{202, "application/json", secret}, "no response 202"},
		{"the wrong content type", "GET", "/api/v1/oauth/jwks", answer{200, "text/plain", `{"keys":[]}`}, "no such content type"},
		{"a refusal in the error shape", "GET", "/api/v1/interns/x/runs/y", answer{404, "application/json", `{"error":{"code":404,"message":"run not found","metadata":{"reason":"not_found"}}}`}, ""},
		{"a refusal in another shape", "GET", "/api/v1/interns/x/runs/y", answer{404, "application/json", `{"error":"not_found"}`}, "error"},
		{"an event stream, unread", "GET", "/api/v1/interns/x/runs/y/events", answer{200, "text/event-stream", "data: not json\n\n"}, ""},
		{"an event stream where JSON is due", "GET", "/api/v1/interns/x/runs/y", answer{200, "text/event-stream", "data: {}\n\n"}, "event stream"},
		{"a path the document lacks, refused", "POST", "/api/v1/no/such/route", answer{404, "application/json", `{}`}, ""},
		{"a path the document lacks, answered", "GET", "/api/v1/interns/x/secrets", answer{200, "application/json", `{}`}, "missing from the document"},
		{"a method the document lacks, answered", "PUT", "/api/v1/oauth/jwks", answer{200, "application/json", `{"keys":[]}`}, "missing from the document"},
		{"a Connect procedure", "POST", "/api/v1/cohort.v1.WorkspaceService/GetWorkspace", answer{200, "application/json", `{}`}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reports, body := check(t, tc.method, tc.path, tc.a)
			if body != tc.a.body {
				t.Errorf("the caller read %q, the server wrote %q", body, tc.a.body)
			}
			switch {
			case tc.want == "" && len(reports) > 0:
				t.Errorf("reported %q", reports)
			case tc.want != "" && (len(reports) != 1 || !strings.Contains(reports[0], tc.want)):
				t.Errorf("want one report naming %q, got %q", tc.want, reports)
			}
		})
	}
}

// BenchmarkCheck is the cost of checking one refusal, as the hostile
// suite sends thousands: the schema is compiled once, not per answer.
func BenchmarkCheck(b *testing.B) {
	c, err := Default()
	if err != nil {
		b.Fatal(err)
	}
	req, _ := http.NewRequest("POST", "http://gw/api/v1/interns/x/chat/completions", nil)
	body := `{"error":{"code":400,"message":"stream must be true: this endpoint only streams","metadata":{"reason":"bad_request"}}}`
	for b.Loop() {
		res := &http.Response{StatusCode: 400, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body))}
		if err := c.Check(req, res); err != nil {
			b.Fatal(err)
		}
	}
}
