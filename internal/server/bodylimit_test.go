package server_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

var bombOnce struct {
	sync.Once
	b []byte
}

// bomb is a gzip body of about 1 MB that inflates to 1 GiB: 1,024
// members of 1 MiB of zeros each (a gzip reader reads every member).
func bomb(t testing.TB) []byte {
	bombOnce.Do(func() {
		var member bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
		zw.Write(make([]byte, 1<<20))
		zw.Close()
		bombOnce.b = bytes.Repeat(member.Bytes(), 1024)
	})
	return bombOnce.b
}

// allocated is the bytes the process has allocated so far (cumulative:
// a transient spike of an inflated body counts, though a GC frees it).
func allocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// connectProcedures lists every procedure of the gateway's Connect services.
func connectProcedures(t *testing.T) []string {
	var out []string
	for _, svc := range []string{
		cohortv1connect.WorkspaceServiceName, cohortv1connect.AdminServiceName, cohortv1connect.InternServiceName,
		cohortv1connect.VaultServiceName, cohortv1connect.VaultAdminServiceName, cohortv1connect.InternGatewayServiceName,
		cohortv1connect.ChatServiceName, cohortv1connect.FederationServiceName,
	} {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
		if err != nil {
			t.Fatal(err)
		}
		ms := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range ms.Len() {
			out = append(out, "/"+svc+"/"+string(ms.Get(i).Name()))
		}
	}
	return out
}

// TestBombWithoutCredential sends a gzip bomb (1 MB inflating to 1 GiB)
// with no credential to every door that takes a body, every Connect
// procedure, and paths and procedures that do not exist: each answers at
// once, in its door's error body, and the gateway allocates a few MB at
// most for it.
func TestBombWithoutCredential(t *testing.T) {
	e := testenv.New(t, storetest.SQLite(t))
	body := bomb(t)
	type door struct {
		method, path, contentType string
		status                    int
		// shape: "connect" (a Connect error), "rest", "oauth".
		shape string
	}
	var doors []door
	for _, p := range connectProcedures(t) {
		doors = append(doors, door{"POST", p, "application/json", 413, "connect"})
		doors = append(doors, door{"POST", p, "application/proto", 413, "connect"})
	}
	doors = append(doors,
		door{"POST", "/cohort.v1.ChatService/StreamChatCompletion", "application/connect+json", 200, "connect-stream"},
		door{"POST", "/cohort.v1.WorkspaceService/NoSuchProcedure", "application/json", 404, "connect"},
		door{"POST", "/cohort.v1.NoSuchService/Create", "application/json", 404, "rest"},
		door{"POST", "/workspaces", "application/json", 413, "rest"},
		door{"PUT", "/vault/secrets/x", "application/json", 413, "rest"},
		door{"PUT", "/vault/interns/i/secrets/x", "application/json", 413, "rest"},
		door{"POST", "/interns/i/chat/completions", "application/json", 413, "rest"},
		door{"POST", "/oauth/token", "application/x-www-form-urlencoded", 413, "oauth"},
		door{"POST", "/no/such/path", "application/json", 404, "rest"},
		door{"DELETE", "/vault/secrets/x", "application/json", 401, "rest"},
	)
	client := e.HTTPClient()
	// Warm up the client's and the server's connection buffers.
	if res, err := client.Get(e.HTTP.URL + "/healthz"); err == nil {
		res.Body.Close()
	}
	for _, d := range doors {
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s%s/%s/chunked=%v", d.method, d.path, d.contentType, chunked), func(t *testing.T) {
				req, _ := http.NewRequest(d.method, e.URL+d.path, bytes.NewReader(body))
				if chunked {
					// No Content-Length: the bound is found while inflating.
					req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), -1
				}
				req.Header.Set("Content-Type", d.contentType)
				req.Header.Set("Content-Encoding", "gzip")
				if d.shape == "connect-stream" {
					req.Header.Set("Connect-Content-Encoding", "gzip")
				}
				runtime.GC()
				before := allocated()
				start := time.Now()
				res, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(res.Body)
				res.Body.Close()
				took := time.Since(start)
				grew := allocated() - before
				want := d.status
				if d.shape == "oauth" && chunked {
					// Not declared too large: refused for its encoding (the
					// exchange takes none), unread.
					want = 400
				}
				if res.StatusCode != want {
					t.Fatalf("status %d, want %d: %s", res.StatusCode, want, got)
				}
				if took > time.Second {
					t.Errorf("answered after %v", took)
				}
				// The body itself is 1 MB, read once (or drained) in 32 KB
				// chunks, plus at most one limit's buffer (1 MiB for chat).
				if grew > 8<<20 {
					t.Errorf("the gateway allocated %d MB for one bomb", grew>>20)
				}
				checkShape(t, d.shape, want, got)
				t.Logf("%d in %v, %d KB allocated", res.StatusCode, took.Round(time.Millisecond), grew>>10)
			})
		}
	}
}

// checkShape checks a refusal's body is its door's.
func checkShape(t *testing.T, shape string, status int, body []byte) {
	t.Helper()
	switch shape {
	case "connect":
		var v struct{ Code, Message string }
		if err := json.Unmarshal(body, &v); err != nil || v.Code == "" || v.Message == "" {
			t.Fatalf("not a Connect error: %s", body)
		}
	case "connect-stream":
		// The end-stream message of a Connect stream (flag 2), maybe
		// compressed (flag 1).
		if len(body) < 5 || body[0]&2 == 0 {
			t.Fatalf("not a Connect end-stream error: %q", body)
		}
	case "rest":
		if err := testenv.ErrorShape(status, string(body)); err != nil {
			t.Fatal(err)
		}
	case "oauth":
		var v struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(body, &v); err != nil || v.Error != "invalid_request" {
			t.Fatalf("not an OAuth error: %s", body)
		}
	}
}

// TestBodyBoundsOfTheSpec sends bodies at each limit of the spec's Limits
// table that a door enforces on its body, and one byte past it: at the
// bound the body is read (any answer but 413), past it 413; gzipped alike,
// the bound applying to what the body inflates to.
func TestBodyBoundsOfTheSpec(t *testing.T) {
	e := testenv.New(t, storetest.SQLite(t))
	key := e.ManagementKey
	cases := []struct {
		name, method, path, contentType string
		limit                           int
	}{
		{"chat body 1 MiB", "POST", "/interns/" + e.InternID + "/chat/completions", "application/json", 1 << 20},
		{"chat body 1 MiB, Connect", "POST", "/cohort.v1.ChatService/StreamChatCompletion", "application/json", 1 << 20},
		{"token exchange body under 32 KB", "POST", "/oauth/token", "application/x-www-form-urlencoded", 32<<10 - 1},
		{"workspace create, default", "POST", "/cohort.v1.WorkspaceService/CreateWorkspace", "application/json", 64 << 10},
	}
	for _, c := range cases {
		for _, gz := range []bool{false, true} {
			if gz && c.path == "/oauth/token" {
				continue // the exchange takes no encoding at all
			}
			for _, n := range []int{c.limit, c.limit + 1} {
				// A JSON string padded to n bytes: valid JSON at the bound.
				b := []byte(`{"x":"` + strings.Repeat("a", n-8) + `"}`)
				if c.contentType != "application/json" {
					b = []byte("a=" + strings.Repeat("b", n-2))
				}
				req, _ := http.NewRequest(c.method, e.URL+c.path, nil)
				if gz {
					var buf bytes.Buffer
					zw := gzip.NewWriter(&buf)
					zw.Write(b)
					zw.Close()
					req.Body = io.NopCloser(&buf)
					req.ContentLength = int64(buf.Len())
					req.Header.Set("Content-Encoding", "gzip")
				} else {
					req.Body = io.NopCloser(bytes.NewReader(b))
					req.ContentLength = int64(len(b))
				}
				req.Header.Set("Content-Type", c.contentType)
				req.Header.Set("Authorization", "Bearer "+key)
				res, err := e.HTTPClient().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(res.Body)
				res.Body.Close()
				over := n > c.limit
				if over != (res.StatusCode == 413) {
					t.Errorf("%s, %d bytes (gzip %v): %d %s", c.name, n, gz, res.StatusCode, got)
				}
				if res.StatusCode >= 500 {
					t.Errorf("%s, %d bytes: %d %s", c.name, n, res.StatusCode, got)
				}
			}
		}
	}
}

// TestUnknownEncoding: an encoding other than gzip is each door's 415
// (the token exchange: its 400 invalid_request), never read as plain.
func TestUnknownEncoding(t *testing.T) {
	e := testenv.New(t, storetest.SQLite(t))
	for _, c := range []struct{ path, ct, shape string }{
		{"/cohort.v1.WorkspaceService/CreateWorkspace", "application/json", "connect"},
		{"/workspaces", "application/json", "rest"},
		{"/interns/" + e.InternID + "/chat/completions", "application/json", "rest"},
	} {
		req, _ := http.NewRequest("POST", e.URL+c.path, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", c.ct)
		req.Header.Set("Content-Encoding", "br")
		res, err := e.HTTPClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 415 {
			t.Errorf("%s: %d %s", c.path, res.StatusCode, got)
		}
		checkShape(t, c.shape, 415, got)
	}
}
