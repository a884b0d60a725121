package hostile_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/metrics"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/openapi/openapitest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// A probe is one hostile request.
type probe struct {
	name, method, path string
	header             http.Header
	body               []byte
}

// bodies are the malformed JSON bodies every route is sent.
func bodies() map[string][]byte {
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	deepObj := strings.Repeat(`{"a":`, 50000) + "1" + strings.Repeat("}", 50000)
	return map[string][]byte{
		"truncated":          []byte(`{"name": "x"`),
		"not an object":      []byte(`[1, 2, 3]`),
		"null":               []byte(`null`),
		"two objects":        []byte(`{"name":"a"}{"name":"b"}`),
		"invalid utf-8":      []byte("{\"name\": \"\xff\xfe\xfd\", \"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}"),
		"escaped surrogate":  []byte(`{"name": "\ud800", "messages": [{"role": "user", "content": "\udfff"}]}`),
		"raw NUL":            []byte("{\"name\": \"a\x00b\", \"value\": \"\x00\"}"),
		"escaped NUL":        []byte(`{"name": "a\u0000b", "value": "\u0000", "hosts": ["a\u0000.example"]}`),
		"huge number":        []byte(`{"io_logging_sampling_rate": 1e999999, "max_tokens": 123456789012345678901234567890}`),
		"negative huge":      []byte(`{"io_logging_sampling_rate": -1e308, "temperature": -9e9999}`),
		"duplicate keys":     []byte(`{"name": "a", "name": "b", "stream": true, "stream": false}`),
		"wrong types":        []byte(`{"name": 1, "messages": "hi", "hosts": {"a": 1}, "value": [1]}`),
		"deep array":         []byte(deep),
		"deep object":        []byte(deepObj),
		"long string":        []byte(`{"name": "` + strings.Repeat("x", 900<<10) + `"}`),
		"empty":              nil,
		"whitespace":         []byte(" \n\t "),
		"form":               []byte("name=x&grant_type=y"),
		"proto garbage":      {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x00, 0xff},
		"control characters": []byte("{\"name\": \"\x1b[31m\x07\x08\", \"description\": \"\u202e\"}"),
		"NUL ids":            []byte(`{"intern_id": "\u0000", "id": "a\u0000", "workspace_id": "\u0000", "session_id": "\u0000", "policy_id": "\u0000"}`),
		"traversal ids":      []byte(`{"intern_id": "../../etc/passwd", "id": "..%2f..", "workspace_id": "` + strings.Repeat("w", 100000) + `"}`),
	}
}

var bigOnce struct {
	sync.Once
	twenty, bomb []byte
}

// big returns a 20 MB JSON-looking body and a 1 MB gzip body that
// inflates to 1 GiB.
func big() (twenty, bomb []byte) {
	bigOnce.Do(func() {
		bigOnce.twenty = append(append([]byte(`{"name": "`), bytes.Repeat([]byte("a"), 20<<20)...), `"}`...)
		var member bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
		zw.Write(make([]byte, 1<<20))
		zw.Close()
		bigOnce.bomb = bytes.Repeat(member.Bytes(), 1024)
	})
	return bigOnce.twenty, bigOnce.bomb
}

// routes are every route of both doors: each REST route (with its path
// parameters filled with hostile ids too), every Connect procedure of
// every service, and paths that name none.
func routes(t *testing.T, internID string) [][2]string {
	ids := []string{
		internID,
		strings.Repeat("a", 10000),
		"..%2F..%2F..%2Fetc%2Fpasswd",
		"%00",
		"..",
		"%2e%2e",
		"x%0d%0aSet-Cookie:%20a=b",
	}
	var out [][2]string
	for _, id := range ids {
		out = append(out,
			[2]string{"POST", "/interns/" + id + "/chat/completions"},
			[2]string{"PUT", "/vault/interns/" + id + "/secrets/" + id},
			[2]string{"DELETE", "/vault/interns/" + id + "/secrets/" + id},
			[2]string{"GET", "/vault/interns/" + id + "/secrets"},
			[2]string{"PUT", "/vault/secrets/" + id},
			[2]string{"DELETE", "/vault/secrets/" + id},
			[2]string{"GET", "/webhooks/endpoints/" + id},
			[2]string{"PATCH", "/webhooks/endpoints/" + id},
			[2]string{"DELETE", "/webhooks/endpoints/" + id},
			[2]string{"POST", "/webhooks/endpoints/" + id + "/rotate-secret"},
			[2]string{"GET", "/webhooks/endpoints/" + id + "/deliveries"},
			[2]string{"POST", "/webhooks/deliveries/" + id + "/redeliver"},
			[2]string{"GET", "/interns/" + id + "/runs/" + id},
			[2]string{"GET", "/interns/" + id + "/runs/" + id + "/events"},
			[2]string{"POST", "/interns/" + id + "/runs/" + id + "/cancel"},
			[2]string{"GET", "/interns/" + id + "/sessions/" + id + "/runs"},
		)
	}
	out = append(out,
		[2]string{"POST", "/workspaces"},
		[2]string{"GET", "/vault/secrets"},
		[2]string{"POST", "/vault/nothing/here"},
		[2]string{"POST", "/oauth/token"},
		[2]string{"GET", "/oauth/token"},
		[2]string{"GET", "/oauth/jwks"},
		[2]string{"POST", "/no/such/route"},
		[2]string{"POST", "/cohort.v1.WorkspaceService/NoSuchProcedure"},
		[2]string{"POST", "/cohort.v1.NoSuchService/Create"},
		[2]string{"GET", "/../../healthz"},
	)
	// Every service of the API's package, so that a new one cannot be
	// left out.
	services := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("cohort.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			services++
			for j := range svc.Methods().Len() {
				out = append(out, [2]string{"POST", "/" + string(svc.FullName()) + "/" + string(svc.Methods().Get(j).Name())})
			}
		}
		return true
	})
	if services < 10 {
		t.Fatalf("only %d services of cohort.v1 are registered", services)
	}
	return out
}

// probes crosses routes with bodies, content types and encodings. Every
// route gets every malformed body as JSON; a sample of the other
// variations (content types, encodings, sizes) goes to every route too.
func probes(t *testing.T, internID string) []probe {
	twenty, bomb := big()
	var out []probe
	names := make([]string, 0)
	bs := bodies()
	for n := range bs {
		names = append(names, n)
	}
	sort.Strings(names)
	variants := []struct {
		name, contentType, encoding string
		body                        []byte
	}{
		{"20 MB", "application/json", "", twenty},
		{"gzip bomb", "application/json", "gzip", bomb},
		{"not gzip", "application/json", "gzip", []byte(`{"name": ""}`)},
		{"brotli", "application/json", "br", []byte(`{}`)},
		// A valid body would be accepted without a Content-Type (it is
		// read as JSON): these fail validation, so nothing is written.
		{"text/plain", "text/plain", "", []byte(`{"name": ""}`)},
		{"no content type", "", "", []byte(`{"name": ""}`)},
		{"bad content type", "application/json; charset=\"", "", []byte(`{}`)},
		{"multipart", "multipart/form-data; boundary=x", "", []byte("--x\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nb\r\n--x--\r\n")},
		{"proto", "application/proto", "", []byte{0xff, 0xff, 0xff}},
		{"connect stream", "application/connect+json", "", []byte{0, 0xff, 0xff, 0xff, 0xff}},
		{"grpc", "application/grpc", "", []byte{0, 0, 0, 0, 5, 1}},
	}
	for _, rt := range routes(t, internID) {
		for _, n := range names {
			ct := "application/json"
			if n == "form" {
				ct = "application/x-www-form-urlencoded"
			}
			h := http.Header{}
			h.Set("Content-Type", ct)
			out = append(out, probe{name: n, method: rt[0], path: rt[1], header: h, body: bs[n]})
		}
		for _, v := range variants {
			h := http.Header{}
			if v.contentType != "" {
				h.Set("Content-Type", v.contentType)
			}
			if v.encoding != "" {
				h.Set("Content-Encoding", v.encoding)
			}
			out = append(out, probe{name: v.name, method: rt[0], path: rt[1], header: h, body: v.body})
		}
	}
	return out
}

func heapLive() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// rowCounts counts the rows of every table of the database.
func rowCounts(t *testing.T, db *bun.DB) map[string]int {
	ctx := context.Background()
	q := `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`
	if db.Dialect().Name() == dialect.PG {
		q = `SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'`
	}
	var tables []string
	if err := db.NewRaw(q).Scan(ctx, &tables); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, tb := range tables {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM "`+tb+`"`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[tb] = n
	}
	return out
}

// TestHostileInput is the hostile-input suite: every route of both doors
// gets every malformed request, without a credential and with the
// organization's management key, on SQLite and on PostgreSQL.
func TestHostileInput(t *testing.T) {
	if testing.Short() {
		t.Skip("the hostile-input suite sends thousands of requests")
	}
	// One database after the other: the heap is the process's, and a
	// suite running beside would move it.
	t.Run("sqlite", func(t *testing.T) { hostile(t, storetest.SQLite(t)) })
	t.Run("postgres", func(t *testing.T) { hostile(t, storetest.Postgres(t)) })
}

func hostile(t *testing.T, db *bun.DB) {
	e := testenv.New(t, db)
	ps := probes(t, e.InternID)
	if len(ps) < 300 {
		t.Fatalf("only %d probes", len(ps))
	}
	// Every REST answer is checked against the OpenAPI document (compiled
	// once per binary): a refusal the document does not describe, or an
	// answer from a route it lacks, fails the suite.
	client := &http.Client{Transport: openapitest.Client(t, e.HTTPClient().Transport), Timeout: 2 * time.Second}
	// The first JWKS read creates the signing key: not a write of a
	// hostile request.
	if res, err := client.Get(e.URL + "/oauth/jwks"); err == nil {
		res.Body.Close()
	}
	rows := rowCounts(t, db)
	statuses := map[int]int{}
	closed := 0
	var slowest time.Duration
	send := func() {
		for _, key := range []string{"", e.ManagementKey} {
			for _, p := range ps {
				req, err := http.NewRequest(p.method, e.URL+p.path, bytes.NewReader(p.body))
				if err != nil {
					// A path the client itself refuses to send.
					continue
				}
				req.Header = p.header.Clone()
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				start := time.Now()
				res, err := client.Do(req)
				took := time.Since(start)
				slowest = max(slowest, took)
				desc := fmt.Sprintf("%s %s [%s] (credential %v)", p.method, trim(p.path), p.name, key != "")
				if err != nil {
					// A route that takes no body answers without reading a
					// large one and closes the connection: the client may
					// see its write fail. Anything else is a failure.
					if len(p.body) > 1<<20 && !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "Timeout") {
						closed++
						continue
					}
					t.Errorf("%s: %v after %v", desc, err, took)
					continue
				}
				b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
				res.Body.Close()
				statuses[res.StatusCode]++
				if res.StatusCode >= 500 {
					t.Errorf("%s: %d %s", desc, res.StatusCode, b)
				}
				if took > 2*time.Second {
					t.Errorf("%s: answered after %v", desc, took)
				}
			}
		}
	}
	// The gateway's log is kept in memory by the test environment: it is
	// read (no credential reaches it) and dropped before each heap read.
	checkLogs := func() {
		logs := e.TakeLogs()
		if logs == "" {
			t.Error("the gateway logged nothing for a round of hostile requests")
		}
		if strings.Contains(logs, e.ManagementKey) || strings.Contains(logs, e.WorkspaceKey) {
			t.Error("a key reached the gateway's log")
		}
	}
	// The first round warms what is kept for good (pools, caches,
	// prepared statements); the second must leave the heap where the
	// first did.
	send()
	client.CloseIdleConnections()
	checkLogs()
	before := heapLive()
	send()
	client.CloseIdleConnections()
	checkLogs()
	grew := int64(heapLive()) - int64(before)
	t.Logf("%d probes × 2 credentials × 2 rounds: statuses %v, %d connections closed unread, slowest %v",
		len(ps), statuses, closed, slowest.Round(time.Millisecond))
	t.Logf("live heap %d MB after the first round, %+d KB after the second", before>>20, grew>>10)
	if c, _ := openapitest.Default(); c != nil {
		t.Logf("%d REST answers (of this binary's suite so far) held to an operation of the OpenAPI document", c.Checked())
	}
	// Pools that grow to their bound (database connections) move it by a
	// few MB; a request that left 2 KB behind would move it by over 20.
	if grew > 12<<20 {
		t.Errorf("the live heap grew by %d MB over a round of hostile requests", grew>>20)
	}

	// Ready afterwards.
	res, err := client.Get(e.HTTP.URL + "/readyz")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("not ready afterwards: %v %v", res, err)
	}
	res.Body.Close()
	// Nothing written.
	after := rowCounts(t, db)
	for tb, n := range after {
		if rows[tb] != n {
			t.Errorf("table %s: %d rows before, %d after", tb, rows[tb], n)
		}
	}
}

func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
