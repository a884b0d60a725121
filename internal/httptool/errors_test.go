package httptool_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/httptool"
)

// Every refusal and failure of the tool is an *apierr.Error whose status
// and reason are ones the daemon and the gateway already answer with, and
// whose message (what the model sees) is the tool's.
func TestErrorsAreAPIErrorReasons(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hang := make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hang":
			select {
			case <-r.Context().Done():
			case <-hang:
			}
		case "/broken":
			// Promise 100 bytes, send 10, hang up.
			w.Header().Set("Content-Length", "100")
			w.Write([]byte("0123456789"))
			w.(http.Flusher).Flush()
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
		default:
			w.Write([]byte("ok"))
		}
	}))
	t.Cleanup(func() { close(hang); srv.Close() })
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	at := func(path string) string { return "https://api.example.com:" + port + path }
	local := func(timeout time.Duration) *httptool.Tool {
		return httptool.New(httptool.Options{ExtraRoots: []*x509.Certificate{srv.Certificate()}, AllowLoopback: true,
			Resolve: func(string) string { return "127.0.0.1" }, Timeout: timeout})
	}
	// A port where nothing listens.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, closedPort, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	big := strings.Repeat("x", httptool.MaxReqBody+1)
	withSecret := map[string]string{"Authorization": "Bearer {{secret:k}}"}
	refusedBy := func(err error) httptool.Releaser {
		return func(context.Context, string, string) (string, error) { return "", err }
	}
	releasesAnything := func(context.Context, string, string) (string, error) { return "v4lue", nil }

	cases := []struct {
		name    string
		tool    *httptool.Tool
		ctx     context.Context
		args    httptool.Args
		release httptool.Releaser
		status  int
		reason  apierr.Reason
		message string
	}{
		{"method", local(0), ctx, httptool.Args{Method: "TRACE", URL: at("/")}, nil, 400, "bad_request", `method "TRACE" is not supported`},
		{"scheme", local(0), ctx, httptool.Args{URL: "http://api.example.com/"}, nil, 400, "bad_request", "only https URLs"},
		{"header", local(0), ctx, httptool.Args{URL: at("/"), Headers: map[string]string{"Host": "x"}}, nil, 400, "bad_request", "set by the tool"},
		{"body", local(0), ctx, httptool.Args{Method: "POST", URL: at("/"), Body: &big}, nil, 413, "payload_too_large", "the body is longer than"},
		{"ip host with a secret", local(0), ctx, httptool.Args{URL: "https://127.0.0.1/", Headers: withSecret},
			refusedBy(apierr.BadRequest("destination host: not a DNS name")), 400, "bad_request", "secrets are only sent to DNS hostnames"},
		{"vault refusal", local(0), ctx, httptool.Args{URL: at("/"), Headers: withSecret},
			refusedBy(apierr.New(403, "host_not_allowed", `secret "k" is not bound to host "api.example.com"`)), 403, "host_not_allowed",
			`secret "k" was not released for host "api.example.com": secret "k" is not bound`},
		{"vault not asked", local(0), ctx, httptool.Args{URL: at("/"), Headers: withSecret},
			refusedBy(errors.New("no vault connection")), 502, "", `secret "k" was not released for host "api.example.com": no vault connection`},
		{"not public", httptool.New(httptool.Options{Resolve: func(string) string { return "10.0.0.1" }}), ctx, httptool.Args{URL: "https://api.example.com/"}, nil,
			403, "forbidden", "refused to connect to a non-public address"},
		{"unreachable", local(0), ctx, httptool.Args{URL: "https://api.example.com:" + closedPort + "/"}, nil, 502, "", "the request failed"},
		{"timeout", local(200 * time.Millisecond), ctx, httptool.Args{URL: at("/hang")}, nil, 504, "timeout", "timed out"},
		{"cancelled", local(0), cancelled, httptool.Args{URL: at("/")}, nil, 499, "client_closed_request", "the request failed"},
		{"broken response", local(0), ctx, httptool.Args{URL: at("/broken")}, nil, 502, "stream_severed", "reading the response failed"},
		// A state that cannot happen: the vault released for a host it
		// never releases for. A bug, answered as any internal error.
		{"bug", local(0), ctx, httptool.Args{URL: "https://127.0.0.1/", Headers: withSecret}, releasesAnything, 500, "internal", "internal error"},
	}
	for _, c := range cases {
		_, err := c.tool.Do(c.ctx, &c.args, c.release)
		var e *apierr.Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: %T %v is not an *apierr.Error", c.name, err, err)
		}
		if e.Status != c.status || e.Reason != c.reason || !strings.Contains(e.Message, c.message) {
			t.Errorf("%s: %d %q %q, want %d %q %q", c.name, e.Status, e.Reason, e.Message, c.status, c.reason, c.message)
		}
		if strings.Contains(e.Error(), "v4lue") {
			t.Errorf("%s: the value is in the error: %v", c.name, e)
		}
		if e.Bug != (c.name == "bug") {
			t.Errorf("%s: bug %v", c.name, e.Bug)
		}
	}
	// The arguments' decoder and the shape check answer the same way.
	if _, err := httptool.DecodeArgs([]byte(`{}`)); !apierr.Is(err, 400, "bad_request") {
		t.Errorf("decode: %v", err)
	}
	if err := httptool.Check(&httptool.Args{URL: "https://user:pw@api.example.com/"}); !apierr.Is(err, 400, "bad_request") {
		t.Errorf("check: %v", err)
	}
}
