package sse_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/sse"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// Chunk builders mirroring what the chat orchestration emits.
const id, created = "chatcmpl-test", 1700000000

func ptr[T any](v T) *T { return &v }

func chunk(model string, d *cohortv1.ChatDelta, finish *string) *cohortv1.ChatCompletionChunk {
	return &cohortv1.ChatCompletionChunk{Id: id, Object: "chat.completion.chunk", Created: created, Model: model,
		Choices: []*cohortv1.ChatChoice{{Delta: d, FinishReason: finish}}}
}

func role(model string) *cohortv1.ChatCompletionChunk {
	return chunk(model, &cohortv1.ChatDelta{Role: ptr("assistant")}, nil)
}

func text(model, s string) *cohortv1.ChatCompletionChunk {
	return chunk(model, &cohortv1.ChatDelta{Content: &s}, nil)
}

func reasoning(model, s string) *cohortv1.ChatCompletionChunk {
	return chunk(model, &cohortv1.ChatDelta{Reasoning: &s}, nil)
}

func finish(model, reason string) *cohortv1.ChatCompletionChunk {
	return chunk(model, &cohortv1.ChatDelta{}, &reason)
}

func failed(model string, code int32, reason, msg string) *cohortv1.ChatCompletionChunk {
	c := finish(model, "error")
	c.Error = &cohortv1.ChunkError{Code: code, Message: msg, Reason: reason}
	return c
}

func final(model string, session *string, u *cohortv1.ChatUsage) *cohortv1.ChatCompletionChunk {
	return &cohortv1.ChatCompletionChunk{Id: id, Object: "chat.completion.chunk", Created: created, Model: model,
		Choices: []*cohortv1.ChatChoice{}, SessionId: session, Usage: u}
}

func toolCall(model, callID, args string) *cohortv1.ChatCompletionChunk {
	return chunk(model, &cohortv1.ChatDelta{ToolCalls: []*cohortv1.ToolCall{{Index: 0, Id: callID, Type: "function",
		Function: &cohortv1.FunctionCall{Name: "service.provide_input", Arguments: args}}}}, nil)
}

// list is a Source over a fixed slice.
type list struct {
	chunks []*cohortv1.ChatCompletionChunk
	end    error
}

func (l *list) Next() (*cohortv1.ChatCompletionChunk, error) {
	if len(l.chunks) == 0 {
		if l.end != nil {
			return nil, l.end
		}
		return nil, io.EOF
	}
	c := l.chunks[0]
	l.chunks = l.chunks[1:]
	return c, nil
}

const m = "openai/gpt-test"

// paths are the state table's paths, as chunk sequences.
var paths = []struct {
	name   string
	chunks []*cohortv1.ChatCompletionChunk
}{
	{"stop", []*cohortv1.ChatCompletionChunk{
		role(m), reasoning(m, "thinking…"), text(m, "Hello, "), text(m, "world \"quoted\"\n"), finish(m, "stop"),
		final(m, ptr("sess-1"), &cohortv1.ChatUsage{PromptTokens: 12, CompletionTokens: 5, TotalTokens: 17, Cost: ptr(0.00042), CachedTokens: ptr[int64](3)}),
	}},
	{"stop_without_usage", []*cohortv1.ChatCompletionChunk{
		role("service/intern"), text(m, "hi"), finish(m, "stop"), final(m, ptr("sess-1"), nil),
	}},
	{"tool_calls_permission", []*cohortv1.ChatCompletionChunk{
		role(m), text(m, "I will run ls."),
		toolCall(m, "int-1", `{"kind":"permission","operation":"shell","options":["allow_once","allow_always","reject_once","reject_always"]}`),
		finish(m, "tool_calls"), final(m, ptr("sess-1"), nil),
	}},
	{"tool_calls_elicitation", []*cohortv1.ChatCompletionChunk{
		role(m),
		toolCall(m, "int-2", `{"kind":"elicitation","message":"Which colour?","fields":[{"name":"colour","type":"string","required":true,"options":["red","blue"]}]}`),
		finish(m, "tool_calls"), final(m, ptr("sess-1"), nil),
	}},
	{"error_after_200", []*cohortv1.ChatCompletionChunk{
		role(m), text(m, "partial"), failed(m, 502, "turn_failed", "the model provider failed"), final(m, ptr("sess-1"), nil),
	}},
	{"run_ended", []*cohortv1.ChatCompletionChunk{
		role(m), text(m, "working"), failed("service/intern", 410, "run_ended", "the intern ended the run"),
		final("service/intern", ptr("sess-1"), nil),
	}},
	{"stream_severed", []*cohortv1.ChatCompletionChunk{
		role(m), text(m, "working"),
		failed("service/intern", 502, "stream_severed", "the connection to the intern broke before the run ended"),
		final("service/intern", ptr("sess-1"), nil),
	}},
	{"failed_before_session", []*cohortv1.ChatCompletionChunk{
		role("service/intern"), failed("service/intern", 504, "timeout", "the intern did not answer in time"),
		final("service/intern", nil, nil),
	}},
	{"continuation", []*cohortv1.ChatCompletionChunk{
		role(m), text(m, "file1\nfile2"), finish(m, "stop"),
		final(m, ptr("sess-1"), &cohortv1.ChatUsage{PromptTokens: 30, CompletionTokens: 9, TotalTokens: 39}),
	}},
}

func serve(t *testing.T, src sse.Source, opt sse.Options) (*http.Response, string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := sse.Serve(w, r, src, opt); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func TestGolden(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			res, got := serve(t, &list{chunks: p.chunks}, sse.Options{})
			if res.StatusCode != 200 {
				t.Fatalf("status %d", res.StatusCode)
			}
			for k, v := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
				if res.Header.Get(k) != v {
					t.Errorf("header %s = %q, want %q", k, res.Header.Get(k), v)
				}
			}
			checkWire(t, got)
			golden(t, filepath.Join("testdata", p.name+".golden"), got)
		})
	}
}

// golden compares got with the file byte for byte (or rewrites it).
func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("stream differs from %s\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// checkWire is a strict parser of the stream: every event is one `data:`
// line (or a keepalive comment) followed by a blank line, every chunk is a
// JSON object with one id, `error` only on error chunks, `session_id` and
// `usage` only on the final chunk, the final chunk right before [DONE].
func checkWire(t *testing.T, body string) {
	t.Helper()
	if !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("stream does not end with [DONE]: %q", body)
	}
	events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	var ids = map[string]bool{}
	for i, ev := range events {
		if strings.Contains(ev, "\n") {
			t.Fatalf("event %d spans lines: %q", i, ev)
		}
		if ev == ": keepalive" {
			continue
		}
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			t.Fatalf("event %d is not a data line: %q", i, ev)
		}
		if data == "[DONE]" {
			if i != len(events)-1 {
				t.Fatalf("[DONE] before the end")
			}
			continue
		}
		var c map[string]json.RawMessage
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		var idv string
		json.Unmarshal(c["id"], &idv)
		ids[idv] = true
		var choices []map[string]json.RawMessage
		json.Unmarshal(c["choices"], &choices)
		_, hasErr := c["error"]
		if hasErr && (len(choices) != 1 || string(choices[0]["finish_reason"]) != `"error"`) {
			t.Errorf("event %d: error key on a chunk that is not an error finish: %s", i, data)
		}
		if len(choices) == 1 && string(choices[0]["finish_reason"]) == `"error"` && !hasErr {
			t.Errorf("event %d: error finish without error object", i)
		}
		_, hasSess := c["session_id"]
		_, hasUsage := c["usage"]
		isFinal := len(choices) == 0
		if hasSess != isFinal || hasUsage != isFinal {
			t.Errorf("event %d: session_id/usage present=%v/%v on final=%v", i, hasSess, hasUsage, isFinal)
		}
		if isFinal && i != len(events)-2 {
			t.Errorf("final chunk at %d, not right before [DONE]", i)
		}
	}
	if len(ids) != 1 {
		t.Errorf("chunk ids %v, want one", ids)
	}
}

// gate is a Source that waits before its second chunk.
type gate struct {
	list
	wait <-chan struct{}
	n    int
}

func (g *gate) Next() (*cohortv1.ChatCompletionChunk, error) {
	if g.n == 1 {
		<-g.wait
	}
	g.n++
	return g.list.Next()
}

func TestKeepaliveAfterSilence(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { close(release) })
	src := &gate{list: list{chunks: paths[1].chunks}, wait: release}
	_, got := serve(t, src, sse.Options{Keepalive: 40 * time.Millisecond})
	first, rest, _ := strings.Cut(got, "\n\n")
	if !strings.HasPrefix(first, "data: ") {
		t.Fatalf("first event %q", first)
	}
	n := strings.Count(rest, ": keepalive\n\n")
	if n < 2 {
		t.Errorf("%d keepalives during 300 ms of silence at a 40 ms interval, want several:\n%s", n, got)
	}
	if !strings.HasPrefix(rest, ": keepalive\n\n") {
		t.Errorf("keepalive not right after the silent gap:\n%s", got)
	}
	checkWire(t, got)
}

func TestNoKeepaliveWhileBusy(t *testing.T) {
	t.Parallel()
	_, got := serve(t, &list{chunks: paths[0].chunks}, sse.Options{Keepalive: time.Hour})
	if strings.Contains(got, "keepalive") {
		t.Errorf("keepalive without silence:\n%s", got)
	}
}

func TestSourceErrorEndsWithoutSentinel(t *testing.T) {
	t.Parallel()
	gone := errors.New("caller gone")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := sse.Serve(w, r, &list{chunks: paths[0].chunks[:2], end: gone}, sse.Options{})
		if !errors.Is(err, gone) {
			t.Errorf("Serve returned %v, want %v", err, gone)
		}
	}))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if strings.Contains(string(b), "[DONE]") || strings.Count(string(b), "data: ") != 2 {
		t.Errorf("body %q", b)
	}
}

// blocked never yields after its first chunk.
type blocked struct {
	sent    bool
	release chan struct{}
}

func (b *blocked) Next() (*cohortv1.ChatCompletionChunk, error) {
	if !b.sent {
		b.sent = true
		return role(m), nil
	}
	<-b.release
	return nil, context.Canceled
}

func TestCallerDisconnectReturns(t *testing.T) {
	t.Parallel()
	src := &blocked{release: make(chan struct{})}
	defer close(src.release)
	returned := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		returned <- sse.Serve(w, r, src, sse.Options{Keepalive: time.Hour})
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	if _, err := io.ReadFull(res.Body, buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	res.Body.Close()
	select {
	case err := <-returned:
		if err == nil {
			t.Error("Serve reported a complete stream after the caller left")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the caller disconnected")
	}
}

func TestEncodingEscapes(t *testing.T) {
	t.Parallel()
	s := "quote \" backslash \\ nl \n cr \r tab \t nul \x00 bad \xff ls \u2028 ps \u2029 é 😀 <b>&"
	b := sse.AppendChunk(nil, text(m, s))
	if strings.ContainsAny(string(b), "\n\r") {
		t.Fatalf("raw line break in %s", b)
	}
	var c struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	want := strings.ReplaceAll(s, "\xff", "\ufffd")
	if c.Choices[0].Delta.Content != want {
		t.Errorf("round trip %q, want %q", c.Choices[0].Delta.Content, want)
	}
}

func TestUsageCostNotFiniteIsLeftOut(t *testing.T) {
	t.Parallel()
	for _, cost := range []float64{nan(), inf()} {
		b := sse.AppendChunk(nil, final(m, ptr("s"), &cohortv1.ChatUsage{TotalTokens: 1, Cost: &cost}))
		if strings.Contains(string(b), "cost") || !json.Valid(b) {
			t.Errorf("%s", b)
		}
	}
}

func nan() float64 { z := 0.0; return z / z }
func inf() float64 { z := 0.0; return 1 / z }

// direct makes a list a Direct source: every chunk is ready at once except
// behind a gate, and Close releases a blocked Next with an error.
type direct struct {
	gate
	closed chan struct{}
}

func newDirect(chunks []*cohortv1.ChatCompletionChunk, wait <-chan struct{}) *direct {
	return &direct{gate: gate{list: list{chunks: chunks}, wait: wait}, closed: make(chan struct{})}
}

func (d *direct) Next() (*cohortv1.ChatCompletionChunk, error) {
	if d.n == 1 && d.wait != nil {
		select {
		case <-d.wait:
		case <-d.closed:
			return nil, errors.New("closed")
		}
		d.wait = nil
	}
	d.n++
	return d.list.Next()
}

func (d *direct) Ready() bool { return d.n != 1 || d.wait == nil }

func (d *direct) Close() {
	select {
	case <-d.closed:
	default:
		close(d.closed)
	}
}

// A Direct source (read without the pump goroutine) gives the same bytes
// as the golden files.
func TestDirectGolden(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			_, got := serve(t, newDirect(p.chunks, nil), sse.Options{})
			want, err := os.ReadFile(filepath.Join("testdata", p.name+".golden"))
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("direct stream differs from %s.golden:\n%s", p.name, got)
			}
		})
	}
}

func TestDirectKeepaliveAfterSilence(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { close(release) })
	_, got := serve(t, newDirect(paths[1].chunks, release), sse.Options{Keepalive: 40 * time.Millisecond})
	first, rest, _ := strings.Cut(got, "\n\n")
	if !strings.HasPrefix(first, "data: ") {
		t.Fatalf("first event %q", first)
	}
	if n := strings.Count(rest, ": keepalive\n\n"); n < 2 {
		t.Errorf("%d keepalives during 300 ms of silence at a 40 ms interval, want several:\n%s", n, got)
	}
	if !strings.HasPrefix(rest, ": keepalive\n\n") {
		t.Errorf("keepalive not right after the silent gap:\n%s", got)
	}
	checkWire(t, got)
}

func TestDirectNoKeepaliveWhileBusy(t *testing.T) {
	t.Parallel()
	_, got := serve(t, newDirect(paths[0].chunks, nil), sse.Options{Keepalive: time.Hour})
	if strings.Contains(got, "keepalive") {
		t.Errorf("keepalive without silence:\n%s", got)
	}
}

// A keepalive that cannot be written (the caller stopped reading) closes
// the source, so a Next blocked on a silent intern returns and Serve ends.
func TestDirectFailedKeepaliveClosesSource(t *testing.T) {
	t.Parallel()
	src := newDirect(paths[1].chunks, make(chan struct{}))
	returned := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		returned <- sse.Serve(w, r, src, sse.Options{Keepalive: 20 * time.Millisecond, WriteTimeout: 50 * time.Millisecond})
	}))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	// Hang up without a read: the next keepalive write fails.
	srv.CloseClientConnections()
	select {
	case err := <-returned:
		if err == nil {
			t.Error("Serve reported a complete stream after the caller left")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after its keepalive failed")
	}
	select {
	case <-src.closed:
	default:
		t.Error("the source was not closed")
	}
}

// endless yields the same large chunk for ever.
type endless struct{ c *cohortv1.ChatCompletionChunk }

func (e endless) Next() (*cohortv1.ChatCompletionChunk, error) { return e.c, nil }

// A caller that stops reading mid-stream ends the stream with an error once
// the socket's buffers are full and a write's deadline passes, on the
// pumped and the direct path; without the deadline Serve would block for
// ever.
func TestStuckCallerEndsStream(t *testing.T) {
	t.Parallel()
	big := text("m", strings.Repeat("x", 16<<10))
	for name, src := range map[string]sse.Source{"pumped": endless{big}, "direct": &endlessDirect{endless{big}}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			returned := make(chan error, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				returned <- sse.Serve(w, r, src, sse.Options{Keepalive: time.Hour, WriteTimeout: 50 * time.Millisecond})
			}))
			defer srv.Close()
			res, err := http.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close() // never read
			select {
			case err := <-returned:
				if err == nil {
					t.Error("Serve reported a complete stream to a caller who stopped reading")
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Serve did not return while its caller stopped reading")
			}
		})
	}
}

type endlessDirect struct{ endless }

func (endlessDirect) Ready() bool { return true }
func (endlessDirect) Close()      {}
