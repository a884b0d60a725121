package httpx_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/httpx"
)

type body struct {
	Name  *string   `json:"name"`
	Count *int      `json:"count"`
	Tags  *[]string `json:"tags"`
	Skip  string    `json:"-"`
}

func TestDecodeStrict(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, err string }{
		{`{"name":"a","count":1,"tags":["x"]}`, ""},
		{` {"name":null} `, ""},
		{`{}`, ""},
		{``, "empty"},
		{`null`, "JSON object"},
		{`[1]`, "JSON object"},
		{`{"name":"a"`, "malformed"},
		{`{"name":"a"}x`, "malformed"},
		{`{"name":"a"}{}`, "after the object"},
		{`{"nope":1}`, `unknown field "nope"`},
		{`{"NAME":"a"}`, `unknown field "NAME"`},
		{`{"Skip":"a"}`, `unknown field "Skip"`},
		{`{"name":"a","name":"b"}`, `duplicate field "name"`},
		{`{"count":"1"}`, `field "count" must be an integer`},
		{`{"count":1.5}`, `field "count" must be an integer`},
		{`{"tags":"x"}`, `field "tags" must be an array`},
		{`{"tags":[1]}`, `must be a string`},
		{`{"name":{"a":1}}`, `field "name" must be a string`},
	}
	for _, c := range cases {
		var b body
		err := httpx.DecodeStrict([]byte(c.in), &b)
		if c.err == "" {
			if err != nil {
				t.Errorf("%s: %v", c.in, err)
			}
			continue
		}
		e := apierr.From(err)
		if err == nil || e.Status != 400 || e.Reason != "bad_request" || !strings.Contains(e.Message, c.err) {
			t.Errorf("%s: got %v, want 400 mentioning %q", c.in, err, c.err)
		}
	}
}

func TestReadBodyLimit(t *testing.T) {
	t.Parallel()
	for _, n := range []int{10, 11} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/", strings.NewReader(strings.Repeat("a", n)))
		b, err := httpx.ReadBody(rec, req, 10, "payload_too_large")
		if n == 10 && (err != nil || len(b) != 10) {
			t.Fatalf("at the limit: %v", err)
		}
		if n == 11 && !apierr.Is(err, http.StatusRequestEntityTooLarge, "payload_too_large") {
			t.Fatalf("past the limit: %v", err)
		}
	}
}

func TestWriteErrorHidesInternals(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/", nil)
	httpx.WriteError(rec, req, apierr.Internal(errString("pq: password=hunter2")), true)
	if rec.Code != 500 || strings.Contains(rec.Body.String(), "hunter2") || !strings.Contains(rec.Body.String(), `"internal error"`) || strings.Contains(rec.Body.String(), "metadata") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	httpx.WriteError(rec, req, apierr.Conflict("busy", "another turn is running"), true)
	if rec.Body.String() != `{"error":{"code":409,"message":"another turn is running","metadata":{"reason":"busy"}}}`+"\n" {
		t.Fatalf("%s", rec.Body)
	}
	rec = httptest.NewRecorder()
	httpx.WriteError(rec, req, apierr.Conflict("busy", "x"), false)
	if rec.Body.String() != `{"error":{"code":409,"message":"x"}}`+"\n" {
		t.Fatalf("%s", rec.Body)
	}
}

type errString string

func (e errString) Error() string { return string(e) }
