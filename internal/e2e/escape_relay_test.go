package e2e_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
)

// reflectingModel is a model endpoint that hands each request back, as
// error pages and debug proxies do: method, path, query, headers and body,
// in response headers, a body streamed in small flushes (cut in the middle
// of whatever key it received, with a pause, so the relay reads its halves
// apart), a trailer, and gzip-compressed when asked (?as=gzip), whatever
// the request's Accept-Encoding.
func reflectingModel(t *testing.T, key string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s?%s | ", req.Method, req.URL.Path, req.URL.RawQuery)
		names := make([]string, 0, len(req.Header))
		for k := range req.Header {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			fmt.Fprintf(&b, "%s: %s | ", k, strings.Join(req.Header[k], ", "))
			w.Header().Set("X-Echo-"+k, strings.Join(req.Header[k], ", "))
		}
		fmt.Fprintf(&b, "body: %s", body)
		j, _ := json.Marshal(map[string]string{"echo": b.String()})
		w.Header().Set("Trailer", "X-Echo-Trailer")
		defer w.Header().Set("X-Echo-Trailer", b.String())
		if req.URL.Query().Get("as") == "gzip" {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			zw.Write(j)
			zw.Close()
			return
		}
		cut := len(j)
		if i := bytes.Index(j, []byte(key)); i >= 0 {
			cut = i + len(key)/2
		}
		w.Write(j[:cut])
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond)
		w.Write(j[cut:])
	}))
	t.Cleanup(srv.Close)
	return srv
}

// The model key never reaches a jail through its model relay, even from an
// upstream that reflects requests: a program in the jail puts the key's
// placeholder in other headers, the query, the path, the body, calls paths
// that are no model API, and reads answers streamed in pieces that split
// the key, with trailers, and compressed. What it reads never holds the
// key (the reflections hold the placeholder); a placeholder outside the
// provider's auth header, or a call outside the model API, is refused with
// 403. (Before the relay was narrowed the key came back in every one.)
func TestEscapeModelKeyReflection(t *testing.T) {
	t.Parallel()
	key := randomCanary("model-key")
	up := reflectingModel(t, key)
	dataDir := t.TempDir()
	c := &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	gw := c.GatewayEnv(t, []string{"COHORT_AGENT_BASE_URL=" + up.URL + "/v1", "COHORT_AGENT_API_KEY=" + key},
		"--provisioner", "local", "--log-level", "info")
	c.load(t)
	tg := &target{c: c, gw: gw}
	tg.waitRunning(t, c.Demo)

	ph := agents.KeyPlaceholder
	curl := func(args string) string {
		return `curl -sS -i --max-time 20 ` + args + ` 2>&1; echo`
	}
	const relay = "http://127.0.0.1:7101/v1"
	type attempt struct {
		name, command string
		// want is in the output when the relay did what it must (a
		// reflection with the placeholder, or the refusal's reason).
		want []string
	}
	attempts := []attempt{
		{"the auth header, reflected in headers, a split body and a trailer",
			curl(`-H "Authorization: Bearer ` + ph + `" -d '{"said":"hi"}' ` + relay + `/chat/completions`),
			[]string{"Authorization: Bearer " + ph, "X-Echo-Authorization: Bearer " + ph}},
		{"the placeholder in the body", curl(`-H "Authorization: Bearer ` + ph + `" -d '{"said":"` + ph + `"}' ` + relay + `/chat/completions`),
			[]string{`{\"said\":\"` + ph + `\"}`}},
		{"a compressed answer", curl(`--compressed -H "Authorization: Bearer ` + ph + `" -d '{}' '` + relay + `/chat/completions?as=gzip'`),
			[]string{"Authorization: Bearer " + ph}},
		{"another header", curl(`-H "Authorization: Bearer ` + ph + `" -H "X-Debug: ` + ph + `" -d '{}' ` + relay + `/chat/completions`),
			[]string{"403 Forbidden", "key_misplaced"}},
		{"the query on any path", curl(`'` + relay + `/any/path?k=` + ph + `'`), []string{"403 Forbidden", "key_misplaced"}},
		{"the query of a model call", curl(`-H "Authorization: Bearer own" -d '{}' '` + relay + `/chat/completions?k=` + ph + `'`),
			[]string{"403 Forbidden", "key_misplaced"}},
		{"the path", curl(`-H "Authorization: Bearer ` + ph + `" ` + relay + `/models/` + ph), []string{"403 Forbidden", "key_misplaced"}},
		{"a path that is no model API", curl(`-H "Authorization: Bearer ` + ph + `" -d '{}' ` + relay + `/files`),
			[]string{"403 Forbidden", "path_not_allowed"}},
		{"Gemini's ?key=, moved into its header", curl(`-d '{}' '` + relay + `/v1beta/models/g:generateContent?key=` + ph + `'`),
			[]string{"X-Goog-Api-Key: " + ph, "POST /v1/v1beta/models/g:generateContent? |"}},
	}
	for _, a := range attempts {
		s := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ "+a.command+"; echo attempt-$((40+2))")))
		raw, _ := json.Marshal(s.Chunks)
		out := s.Text + string(raw)
		if !strings.Contains(s.Text, "attempt-42") {
			t.Fatalf("%s did not run to its end: %q", a.name, s.Text)
		}
		if strings.Contains(out, key) {
			t.Errorf("%s: the model key reached the jail:\n%s", a.name, tail(s.Text, 3000))
		}
		for _, w := range a.want {
			if !strings.Contains(s.Text, w) {
				t.Errorf("%s: %q not in what the jail read:\n%s", a.name, w, tail(s.Text, 3000))
			}
		}
	}
	if strings.Contains(gw.stderr.String(), key) {
		t.Error("the model key is in the gateway's log")
	}
}
