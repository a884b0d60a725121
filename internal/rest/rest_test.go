package rest_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/rest"
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
		err := rest.DecodeStrict([]byte(c.in), &b)
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
		b, err := rest.ReadBody(rec, req, 10, "payload_too_large")
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
	rest.WriteError(rec, req, apierr.Internal(errString("pq: password=hunter2")), true)
	if rec.Code != 500 || strings.Contains(rec.Body.String(), "hunter2") || !strings.Contains(rec.Body.String(), `"internal error"`) || strings.Contains(rec.Body.String(), "metadata") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	rest.WriteError(rec, req, apierr.Conflict("busy", "another turn is running"), true)
	if rec.Body.String() != `{"error":{"code":409,"message":"another turn is running","metadata":{"reason":"busy"}}}`+"\n" {
		t.Fatalf("%s", rec.Body)
	}
	rec = httptest.NewRecorder()
	rest.WriteError(rec, req, apierr.Conflict("busy", "x"), false)
	if rec.Body.String() != `{"error":{"code":409,"message":"x"}}`+"\n" {
		t.Fatalf("%s", rec.Body)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// A gzip body is read decompressed, the limit counting what it
// decompresses to (a small bomb is refused); another encoding is a 415;
// a body that is not gzip though it says so is a 400.
func TestReadBodyEncodings(t *testing.T) {
	t.Parallel()
	gz := func(s string) io.Reader {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write([]byte(s))
		zw.Close()
		return &b
	}
	read := func(body io.Reader, enc string) ([]byte, error) {
		req := httptest.NewRequest("POST", "/", body)
		if enc != "" {
			req.Header.Set("Content-Encoding", enc)
		}
		return rest.ReadBody(httptest.NewRecorder(), req, 100, "payload_too_large")
	}
	if b, err := read(gz(`{"a":1}`), "gzip"); err != nil || string(b) != `{"a":1}` {
		t.Fatalf("gzip: %q %v", b, err)
	}
	if b, err := read(gz(strings.Repeat("a", 100)), "GZIP"); err != nil || len(b) != 100 {
		t.Fatalf("gzip at the limit: %d %v", len(b), err)
	}
	// 101 bytes decompressed, far fewer on the wire.
	if _, err := read(gz(strings.Repeat("a", 101)), "gzip"); !apierr.Is(err, http.StatusRequestEntityTooLarge, "payload_too_large") {
		t.Fatalf("gzip past the limit: %v", err)
	}
	if _, err := read(gz(strings.Repeat("a", 1<<20)), "gzip"); !apierr.Is(err, http.StatusRequestEntityTooLarge, "payload_too_large") {
		t.Fatalf("a gzip bomb: %v", err)
	}
	if _, err := read(strings.NewReader(`{"a":1}`), "gzip"); !apierr.Is(err, http.StatusBadRequest, "bad_request") {
		t.Fatalf("plain body labelled gzip: %v", err)
	}
	if _, err := read(strings.NewReader(`{"a":1}`), "br"); !apierr.Is(err, http.StatusUnsupportedMediaType, "bad_request") {
		t.Fatalf("brotli: %v", err)
	}
	if b, err := read(strings.NewReader(`{"a":1}`), "identity"); err != nil || string(b) != `{"a":1}` {
		t.Fatalf("identity: %q %v", b, err)
	}
}

// Text that is not Unicode is refused with the field that holds it, never
// stored as U+FFFD: bytes that are not UTF-8, and escapes of lone
// surrogates. Valid pairs and escaped backslashes pass.
func TestCheckText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ body, want string }{
		{`{"name":"ok","x":"\ud83d\ude00","y":"\\ud800 is text"}`, ""},
		{"{\"name\":\"bad\xff\"}", "name"},
		{`{"name":"lone \ud800"}`, "name"},
		{`{"name":"\udc00 low first"}`, "name"},
		{`{"a":{"b":[1,{"c":"\ud800x"}]}}`, "a.b[1].c"},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"user","content":"\ud83d"}]}`, "messages[1].content"},
		{"\"\xc3\x28\"", "the body"},
	} {
		err := rest.CheckText([]byte(c.body))
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", c.body, err)
			}
			continue
		}
		if !apierr.Is(err, http.StatusBadRequest, "bad_request") || !strings.Contains(err.Error(), c.want+" is not valid UTF-8") {
			t.Errorf("%q: %v, want the field %s", c.body, err, c.want)
		}
	}
}

// A client that sends its whole body before reading (no early look at the
// response) still gets the JSON 413, not a reset connection: the refused
// body is read and dropped first.
func TestTooLargeBodyIsReadable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := rest.ReadBody(w, r, 1000, "payload_too_large"); err != nil {
			rest.WriteError(w, r, err, true)
		}
	}))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := bytes.Repeat([]byte("a"), 10<<20)
	fmt.Fprintf(c, "PUT / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	if _, err := c.Write(body); err != nil {
		t.Fatalf("the server hung up before the body was sent: %v", err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 413 || !strings.Contains(string(b), `"reason":"payload_too_large"`) {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
}
