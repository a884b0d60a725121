package egress_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/egress"
)

// echo is an upstream that reflects each request: method, path, query,
// headers and body, in its response headers and body, as error pages and
// debug proxies do. It records what it received.
type echo struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []string // each request, as reflected
}

func newEcho(t *testing.T) *echo {
	e := &echo{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s?%s\n", req.Method, req.URL.Path, req.URL.RawQuery)
		names := make([]string, 0, len(req.Header))
		for k := range req.Header {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			fmt.Fprintf(&b, "%s: %s\n", k, strings.Join(req.Header[k], ", "))
		}
		fmt.Fprintf(&b, "\n%s", body)
		reflected := b.String()
		e.mu.Lock()
		e.got = append(e.got, reflected)
		e.mu.Unlock()
		// What the key would look like in a JSON error body.
		j, _ := json.Marshal(map[string]string{"echo": reflected})
		for k, v := range req.Header {
			w.Header().Set("X-Echo-"+k, strings.Join(v, ", "))
		}
		w.Header().Set("Trailer", "X-Echo-Trailer")
		switch req.URL.Query().Get("as") {
		case "hints":
			w.Header().Set("Link", req.Header.Get("Authorization"))
			w.WriteHeader(http.StatusEarlyHints)
		case "gzip", "deflate":
			// Compressed although the relay asked for identity.
			w.Header().Set("Content-Encoding", req.URL.Query().Get("as"))
			var zw io.WriteCloser = gzip.NewWriter(w)
			if req.URL.Query().Get("as") == "deflate" {
				zw = zlib.NewWriter(w)
			}
			zw.Write(j)
			zw.Close()
			w.Header().Set("X-Echo-Trailer", reflected[:min(len(reflected), 200)])
			return
		case "br":
			w.Header().Set("Content-Encoding", "br")
			w.Write(j)
			return
		case "identity-then-gzip", "list":
			// Two codings: on two header lines, or in one comma list; the
			// reflection gzip-compressed.
			if req.URL.Query().Get("as") == "list" {
				w.Header().Set("Content-Encoding", "identity, gzip")
			} else {
				w.Header().Add("Content-Encoding", "identity")
				w.Header().Add("Content-Encoding", "gzip")
			}
			zw := gzip.NewWriter(w)
			zw.Write(j)
			zw.Close()
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		// The reflection in small pieces, flushed one by one, and cut in
		// the middle of the key with a pause, so that the relay reads its
		// halves apart.
		cut := len(j)
		if i := bytes.Index(j, []byte(realKey)); i >= 0 {
			cut = i + len(realKey)/2
		}
		for i := 0; i < len(j); {
			n := min(i+7, len(j))
			if i < cut && n > cut {
				n = cut
			}
			w.Write(j[i:n])
			w.(http.Flusher).Flush()
			if n == cut {
				time.Sleep(50 * time.Millisecond)
			}
			i = n
		}
		w.Header().Set("X-Echo-Trailer", strings.ReplaceAll(reflected, "\n", " | "))
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *echo) requests() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

// seen is everything one exchange showed the client: informational and
// final headers, the (decoded) body and the trailers.
type seen struct {
	status int
	all    string
	body   string
}

// exchange sends a raw request (so nothing normalizes it) over a new
// connection to addr and reads the whole answer as an HTTP client would.
func exchange(t *testing.T, addr, method, target string, header http.Header, body string) seen {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: relay\r\nConnection: close\r\nContent-Length: %d\r\n", method, target, len(body))
	header.Write(&req)
	fmt.Fprintf(&req, "\r\n%s", body)
	if _, err := c.Write(req.Bytes()); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var s seen
	var all strings.Builder
	for {
		tp := textproto.NewReader(br)
		line, err := tp.ReadLine()
		if err != nil {
			t.Fatalf("%s %s: %v", method, target, err)
		}
		var code int
		fmt.Sscanf(line, "HTTP/1.1 %d", &code)
		h, err := tp.ReadMIMEHeader()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&all, "%s\n%v\n", line, h)
		if code >= 200 {
			// The final answer: let net/http read its body (chunks,
			// trailers).
			res, err := http.ReadResponse(bufio.NewReader(io.MultiReader(strings.NewReader(line+"\r\n"+headerText(h)+"\r\n"), br)), nil)
			if err != nil {
				t.Fatal(err)
			}
			var r io.Reader = res.Body
			switch res.Header.Get("Content-Encoding") {
			case "gzip":
				if r, err = gzip.NewReader(r); err != nil {
					t.Fatal(err)
				}
			case "deflate":
				if r, err = zlib.NewReader(r); err != nil {
					t.Fatal(err)
				}
			}
			b, _ := io.ReadAll(r)
			s.status, s.body = code, string(b)
			fmt.Fprintf(&all, "%s\n%v\n", b, res.Trailer)
			s.all = all.String()
			return s
		}
	}
}

func headerText(h textproto.MIMEHeader) string {
	var b bytes.Buffer
	http.Header(h).Write(&b)
	return b.String()
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// serveModel serves the relay's model connections, as a jail's relay hands
// them over: for "" the operator's endpoint, else ServeModel to upstream.
func serveModel(t testing.TB, r *egress.Relay, upstream string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if upstream == "" {
				go r.Serve("intern-a", egress.KindModel, c)
			} else {
				go r.ServeModel("intern-a", c, upstream, func(context.Context) (string, error) { return realKey, nil })
			}
		}
	}()
	return ln.Addr().String()
}

// The key goes only into the provider's own auth header, on its model API
// calls; a placeholder anywhere else, or any other call on the endpoint's
// host, is refused with 403 and a reason, and nothing reaches the upstream.
// (Before: the key went wherever the placeholder was, on any path, and the
// echo handed it back.)
func TestModelRelayPutsTheKeyOnlyInTheAuthHeaderOfModelCalls(t *testing.T) {
	e := newEcho(t)
	r := newRelay(t, egress.Config{ModelBaseURL: e.srv.URL + "/v1", ModelAPIKey: realKey, Placeholder: placeholder})
	addr := serveModel(t, r, "")
	bearer := "Bearer " + placeholder
	refused := []struct {
		name, method, target string
		header               http.Header
		code                 string
	}{
		{"another header", "POST", "/v1/chat/completions", hdr("Authorization", bearer, "X-Debug", placeholder), "key_misplaced"},
		{"the auth header with more", "POST", "/v1/chat/completions", hdr("Authorization", bearer+"x"), "key_misplaced"},
		{"two auth values", "POST", "/v1/chat/completions", hdr("Authorization", bearer, "Authorization", bearer), "key_misplaced"},
		{"the query", "POST", "/v1/chat/completions?k=" + placeholder, hdr("Authorization", "Bearer own"), "key_misplaced"},
		{"the query, escaped", "POST", "/v1/chat/completions?k=%63" + placeholder[1:], nil, "key_misplaced"},
		{"the query on any path", "GET", "/v1/any/path?k=" + placeholder, nil, "key_misplaced"},
		{"the path", "GET", "/v1/models/" + placeholder, hdr("Authorization", bearer), "key_misplaced"},
		{"two providers' headers", "GET", "/v1/models", hdr("Authorization", bearer, "X-Api-Key", placeholder), "key_misplaced"},
		{"a file upload", "POST", "/v1/files", hdr("Authorization", bearer), "path_not_allowed"},
		{"a path outside the API, no key", "GET", "/v1/files", nil, "path_not_allowed"},
		{"outside the endpoint's path", "POST", "/v2/chat/completions", hdr("Authorization", bearer), "path_not_allowed"},
		{"a dot segment", "GET", "/v1/models/../files", hdr("Authorization", bearer), "path_not_allowed"},
		{"an escaped slash", "POST", "/v1/chat%2Fcompletions", hdr("Authorization", bearer), "path_not_allowed"},
		{"the wrong method", "GET", "/v1/chat/completions", hdr("Authorization", bearer), "path_not_allowed"},
		{"Anthropic's header on an OpenAI call", "POST", "/v1/chat/completions", hdr("X-Api-Key", placeholder), "path_not_allowed"},
		{"OpenAI's header on an Anthropic call", "POST", "/v1/messages", hdr("Authorization", bearer), "path_not_allowed"},
		{"Gemini's ?key= on an OpenAI call", "POST", "/v1/chat/completions?key=" + placeholder, nil, "path_not_allowed"},
		{"a protocol switch", "GET", "/v1/models", hdr("Authorization", bearer, "Connection", "Upgrade", "Upgrade", "websocket"), "upgrade_refused"},
	}
	for _, c := range refused {
		s := exchange(t, addr, c.method, c.target, c.header, `{"model":"m"}`)
		var body struct {
			Error struct{ Type, Code, Message string }
		}
		json.Unmarshal([]byte(s.body), &body)
		if s.status != http.StatusForbidden || body.Error.Code != c.code || !strings.HasPrefix(body.Error.Message, "cohort: ") {
			t.Errorf("%s: %d %s, want 403 %s", c.name, s.status, s.body, c.code)
		}
		if strings.Contains(s.all, realKey) {
			t.Errorf("%s: the key came back: %s", c.name, s.all)
		}
	}
	if got := e.requests(); len(got) != 0 {
		t.Fatalf("refused requests reached the upstream: %q", got)
	}

	// Each provider's own header, on its calls: the key there and nowhere
	// else; a placeholder in the body (a conversation that mentions it) is
	// text, never substituted.
	allowed := []struct {
		name, method, target string
		header               http.Header
		want                 string // the header line the upstream saw
	}{
		{"OpenAI chat", "POST", "/v1/chat/completions", hdr("Authorization", bearer), "Authorization: Bearer " + realKey},
		{"OpenAI responses, lower-case scheme", "POST", "/v1/responses", hdr("Authorization", "bearer "+placeholder), "Authorization: Bearer " + realKey},
		{"OpenAI models", "GET", "/v1/models", hdr("Authorization", bearer), "Authorization: Bearer " + realKey},
		{"Anthropic messages", "POST", "/v1/messages?beta=true", hdr("X-Api-Key", placeholder), "X-Api-Key: " + realKey},
		{"Gemini stream", "POST", "/v1/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", hdr("X-Goog-Api-Key", placeholder), "X-Goog-Api-Key: " + realKey},
		{"Gemini ?key=, into the header", "POST", "/v1/v1beta/models/gemini-2.5-pro:generateContent?key=" + placeholder, nil, "X-Goog-Api-Key: " + realKey},
	}
	for i, c := range allowed {
		s := exchange(t, addr, c.method, c.target, c.header, `{"said":"`+placeholder+`"}`)
		got := e.requests()
		if s.status != 200 || len(got) != i+1 {
			t.Fatalf("%s: %d %s", c.name, s.status, s.body)
		}
		up := got[i]
		if !strings.Contains(up, "\n"+c.want+"\n") || strings.Count(up, realKey) != 1 {
			t.Errorf("%s: the upstream saw the key elsewhere or not in its header:\n%s", c.name, up)
		}
		if !strings.HasSuffix(up, `{"said":"`+placeholder+`"}`) || !strings.Contains(up, "Accept-Encoding: identity\n") {
			t.Errorf("%s: body or encoding changed:\n%s", c.name, up)
		}
		// The echo reflected the key in headers, body and trailers: the
		// agent reads the placeholder.
		if strings.Contains(s.all, realKey) || !strings.Contains(s.body, placeholder) {
			t.Errorf("%s: the answer holds the key (or no reflection):\n%s", c.name, s.all)
		}
	}
}

// Every response the relay passes on is free of the key: headers,
// informational headers, a body streamed in pieces that split it,
// trailers, and a body the upstream compressed although asked not to. An
// encoding the relay cannot read is not passed on. The operator's
// endpoint, a jail's own (ServeModel) and intern Pods' (Model) alike.
func TestModelRelayRedactsTheKeyFromEveryResponse(t *testing.T) {
	e := newEcho(t)
	r := newRelay(t, egress.Config{ModelBaseURL: e.srv.URL, ModelAPIKey: realKey, Placeholder: placeholder})
	// Intern Pods' relay: the handler the gateway serves under
	// /intern-relay/ (internal/provision/kuberelay.go).
	pods, err := r.Model(e.srv.URL, func(context.Context) (string, error) { return realKey, nil })
	if err != nil {
		t.Fatal(err)
	}
	podSrv := httptest.NewServer(pods)
	defer podSrv.Close()
	for name, addr := range map[string]string{"operator": serveModel(t, r, ""), "jail upstream": serveModel(t, r, e.srv.URL),
		"pods": strings.TrimPrefix(podSrv.URL, "http://")} {
		if s := exchange(t, addr, "GET", "/v1/any/path?k="+placeholder, nil, ""); s.status != http.StatusForbidden || strings.Contains(s.all, realKey) {
			t.Errorf("%s, any path: %d %s", name, s.status, s.all)
		}
		for _, as := range []string{"stream", "hints", "gzip", "deflate"} {
			s := exchange(t, addr, "POST", "/v1/chat/completions?as="+as, hdr("Authorization", "Bearer "+placeholder, "Accept-Encoding", "gzip, br"), "{}")
			if s.status != 200 || !strings.Contains(s.body, "Bearer "+placeholder) {
				t.Errorf("%s, %s: %d, no reflection: %s", name, as, s.status, s.all)
			}
			if strings.Contains(s.all, realKey) {
				t.Errorf("%s, %s: the key came back:\n%s", name, as, s.all)
			}
		}
		s := exchange(t, addr, "POST", "/v1/chat/completions?as=br", hdr("Authorization", "Bearer "+placeholder), "{}")
		if s.status != http.StatusBadGateway || !strings.Contains(s.body, "upstream_encoding") || strings.Contains(s.all, realKey) {
			t.Errorf("%s, br: %d %s", name, s.status, s.all)
		}
	}
}

// An answer with more than one Content-Encoding (two header lines, or a
// list of two codings) is refused with 502, whatever the first says: the
// relay reads what it forwards, all of it. (Before: "identity" on the first
// line and "gzip" on the second passed the compressed reflection on
// unredacted, and a client that decoded it read the real key.)
func TestModelRelayRefusesSeveralContentEncodings(t *testing.T) {
	e := newEcho(t)
	r := newRelay(t, egress.Config{ModelBaseURL: e.srv.URL, ModelAPIKey: realKey, Placeholder: placeholder})
	addr := serveModel(t, r, "")
	for _, as := range []string{"identity-then-gzip", "list"} {
		s := exchange(t, addr, "POST", "/v1/chat/completions?as="+as, hdr("Authorization", "Bearer "+placeholder), "{}")
		// exchange decodes a gzip body only when the first value says
		// gzip: read the raw bytes too, decoded whatever they are.
		raw := s.all
		if zr, err := gzip.NewReader(strings.NewReader(s.body)); err == nil {
			if b, err := io.ReadAll(zr); err == nil {
				raw += string(b)
			}
		}
		if strings.Contains(raw, realKey) {
			t.Errorf("%s: the key came back: %d %s", as, s.status, raw)
		}
		if s.status != http.StatusBadGateway || !strings.Contains(s.body, "upstream_encoding") {
			t.Errorf("%s: %d %s, want 502 upstream_encoding", as, s.status, s.all)
		}
	}
}
