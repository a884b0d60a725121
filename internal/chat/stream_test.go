package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

const model = "openai/gpt-test"

func ended(msg string) *interndv1.RunEvent {
	return finishedEv("", &interndv1.Finished{Reason: interndv1.Finished_REASON_ENDED, Code: 410, ErrorReason: "run_ended", Message: msg})
}

func continuation(session string) *interndv1.RunEvent {
	ev := started(session)
	ev.GetStarted().Continuation = true
	return ev
}

// streamCases are the paths of the run state table through the REST door;
// each response is compared byte for byte with testdata/<name>.golden.
var streamCases = []struct {
	name   string
	body   string
	sc     script
	finish string
	reason string // of the error chunk
}{
	{"stop", userBody("hello"), events(nil,
		started("sess-1"), reasoningEv(model, "The user greets me."), textEv(model, "Hello"), textEv(model, ", world."),
		usageEv(model, &interndv1.Usage{PromptTokens: 21, CompletionTokens: 7, TotalTokens: 28, Cost: ptr(0.000315), CachedTokens: ptr[int64](16)}),
		stopEv(model)), "stop", ""},
	{"stop_model_changes", userBody("hello"), events(nil,
		started("sess-1"), textEv("model-a", "one "), textEv("", "daemon note "), textEv("model-b", "two"), stopEv("model-b")), "stop", ""},
	{"stop_without_started", userBody("hello"), events(nil,
		textEv(model, "third-party agent"), stopEv(model)), "stop", ""},
	{"tool_calls_permission", userBody("$ ls", `,"approval_mode":"manual"`), events(nil,
		started("sess-1"), textEv(model, "I will list the files."),
		permissionEv(model, "int-1", ptr("shell")),
		usageEv(model, &interndv1.Usage{PromptTokens: 1, CompletionTokens: 1, TotalTokens: 2}),
		finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED})), "tool_calls", ""},
	{"tool_calls_permission_no_operation", userBody("$ ls", `,"approval_mode":"manual"`), events(nil,
		started("sess-1"), permissionEv(model, "int-1", nil),
		finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED})), "tool_calls", ""},
	{"tool_calls_elicitation", userBody("colour?"), events(nil,
		started("sess-1"), questionEv(model, "int-2"),
		finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED})), "tool_calls", ""},
	{"error_after_200", userBody("hello"), events(nil,
		started("sess-1"), textEv(model, "partial"),
		finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_ERROR, Code: 502, ErrorReason: "turn_failed", Message: "the model provider failed"})), "error", "turn_failed"},
	{"error_after_200_relayed_detail", userBody("hello"), events(refuse(409, "attachment_failed"),
		started("sess-1"), textEv(model, "partial")), "error", "attachment_failed"},
	{"run_ended", userBody("hello"), events(nil,
		started("sess-1"), textEv(model, "working"), ended("the run was cancelled")), "error", "run_ended"},
	{"stream_severed", userBody("hello"), events(nil,
		started("sess-1"), textEv(model, "working")), "error", "stream_severed"},
	{"stream_severed_transport", userBody("hello"), events(connect.NewError(connect.CodeInternal, errors.New("boom")),
		started("sess-1"), textEv(model, "working")), "error", "stream_severed"},
	{"continuation", toolBody("sess-1", "int-1", "allow_once"), events(nil,
		continuation("sess-1"), textEv(model, "file1\nfile2\n"),
		usageEv(model, &interndv1.Usage{PromptTokens: 40, CompletionTokens: 9, TotalTokens: 49}), stopEv(model)), "stop", ""},
	{"continuation_pauses_again", toolBody("sess-1", "int-1", `{"action":"accept","content":{"colour":"red"}}`), events(nil,
		continuation("sess-1"), permissionEv(model, "int-3", ptr("shell")),
		finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED})), "tool_calls", ""},
	{"continuation_after_cancel", toolBody("sess-1", "int-1", "cancel"), events(nil,
		continuation("sess-1"), ended("the caller cancelled the run")), "error", "run_ended"},
}

func TestStreams(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db)
		for _, c := range streamCases {
			e.d.set(c.sc, c.sc)
			status, body, h := e.chat(t, c.body)
			if status != 200 {
				t.Fatalf("%s: %d %s", c.name, status, body)
			}
			for k, v := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
				if h.Get(k) != v {
					t.Errorf("%s: %s = %q", c.name, k, h.Get(k))
				}
			}
			chunks, _ := parseStream(t, body)
			if got := finishOf(chunks); got != c.finish {
				t.Errorf("%s: finish %s, want %s", c.name, got, c.finish)
			}
			final := chunks[len(chunks)-1]
			if c.name == "stop_without_started" {
				// No Started event, no session reported: null.
				if final.SessionID != nil {
					t.Errorf("%s: session_id %v", c.name, *final.SessionID)
				}
			} else if final.SessionID == nil || *final.SessionID != "sess-1" {
				t.Errorf("%s: final session_id %v", c.name, final.SessionID)
			}
			if c.finish == "tool_calls" && string(final.Usage) != "null" {
				t.Errorf("%s: usage after tool_calls: %s", c.name, final.Usage)
			}
			if c.reason != "" {
				if er := chunks[len(chunks)-2].Error; er.Metadata.Reason != c.reason {
					t.Errorf("%s: error reason %s, want %s", c.name, er.Metadata.Reason, c.reason)
				}
			}
			golden(t, filepath.Join("testdata", c.name+".golden"), body)
			e.d.waitEnded(t)
		}
	})
}

// TestInteractionArguments checks the arguments string a client parses.
func TestInteractionArguments(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))
	for _, c := range []struct {
		ev   *interndv1.RunEvent
		want string
	}{
		{permissionEv(model, "int-1", ptr("shell")), `{"kind":"permission","operation":"shell","options":["allow_once","allow_always","reject_once","reject_always"]}`},
		{permissionEv(model, "int-1", nil), `{"kind":"permission","operation":null,"options":["allow_once","allow_always","reject_once","reject_always"]}`},
		// The spec's fields unchanged, then what is asked: title and input.
		{shellPermissionEv(model, "int-1", "Run ls", "ls -la <dir> && echo \"done\""),
			`{"kind":"permission","operation":"shell","options":["allow_once","allow_always","reject_once","reject_always"],"title":"Run ls","input":"ls -la \u003cdir\u003e \u0026\u0026 echo \"done\""}`},
		{questionEv(model, "int-1"), `{"kind":"elicitation","message":"Which colour?","fields":[{"name":"colour","type":"string","required":true,"options":["red","blue"]},{"name":"note","type":"string","required":false}]}`},
	} {
		sc := events(nil, started("s"), c.ev, finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED}))
		e.d.set(sc, sc)
		_, body, _ := e.chat(t, userBody("x"))
		chunks, _ := parseStream(t, body)
		tc := chunks[1].Choices[0].Delta.ToolCalls
		if len(tc) != 1 || tc[0].ID != "int-1" || tc[0].Type != "function" || tc[0].Function.Name != "service.provide_input" || tc[0].Index != 0 {
			t.Fatalf("tool call %+v", tc)
		}
		if tc[0].Function.Arguments != c.want {
			t.Errorf("arguments %s\nwant %s", tc[0].Function.Arguments, c.want)
		}
		if !json.Valid([]byte(tc[0].Function.Arguments)) {
			t.Error("arguments not JSON")
		}
	}
}

// TestFailureBeforeSession: a run that fails before the intern reported a
// session has session_id null on the final chunk.
func TestFailureBeforeSession(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))
	sc := events(nil, textEv(model, "x"))
	e.d.set(sc, sc)
	_, body, _ := e.chat(t, userBody("x", `,"session_id":"mine"`))
	chunks, _ := parseStream(t, body)
	final := chunks[len(chunks)-1]
	if final.SessionID != nil || string(final.raw["session_id"]) != "null" {
		t.Errorf("session_id %s", final.raw["session_id"])
	}
}

func TestStreamTimeout(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t), func(s *server.Server) { s.Chat.EventTimeout = 200 * time.Millisecond })
	sc := func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(started("sess-1"))
		send(textEv(model, "thinking"))
		<-ctx.Done()
		return ctx.Err()
	}
	e.d.set(sc, sc)
	status, body, _ := e.chat(t, userBody("x"))
	if status != 200 {
		t.Fatal(status)
	}
	chunks, _ := parseStream(t, body)
	er := chunks[len(chunks)-2]
	if er.Error == nil || er.Error.Code != 504 || er.Error.Metadata.Reason != "timeout" || er.Model != "service/intern" {
		t.Errorf("timeout chunk %v", er.raw)
	}
	if chunks[len(chunks)-1].Model != "service/intern" {
		t.Error("final chunk after a timeout is not service/intern")
	}
	if err := e.d.waitEnded(t); err == nil {
		t.Error("the daemon call was not cancelled on timeout")
	}
	golden(t, "testdata/timeout_after_200.golden", body)
}

func TestKeepalive(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t), func(s *server.Server) { s.ChatSSE.Keepalive = 30 * time.Millisecond })
	sc := func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(started("sess-1"))
		// The stream opens on the agent's first event, not on Started.
		send(reasoningEv(model, "thinking"))
		time.Sleep(250 * time.Millisecond)
		send(textEv(model, "done"))
		return send(stopEv(model))
	}
	e.d.set(sc, sc)
	_, body, _ := e.chat(t, userBody("x"))
	_, n := parseStream(t, body)
	if n < 2 {
		t.Errorf("%d keepalives in 250 ms of silence at 30 ms:\n%s", n, body)
	}
}

// TestCallerDisconnectCancelsRun: hanging up mid-run cancels the daemon call.
func TestCallerDisconnectCancelsRun(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))
	sc := func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(started("sess-1"))
		send(textEv(model, "streaming"))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return send(stopEv(model))
		}
	}
	e.d.set(sc, sc)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.URL+"/interns/"+e.InternID+"/chat/completions", strings.NewReader(userBody("x")))
	req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
	res, err := e.HTTPClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 {
		t.Fatal(res.StatusCode)
	}
	buf := make([]byte, 64)
	if _, err := io.ReadAtLeast(res.Body, buf, 10); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cancel()
	res.Body.Close()
	if err := e.d.waitEnded(t); !errors.Is(err, context.Canceled) {
		t.Errorf("daemon call ended with %v, want cancelled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("cancellation took %v", d)
	}
}

// TestDisconnectAfterPauseLeavesRun: once tool_calls and [DONE] are out,
// the daemon call has completed on its own; the caller hanging up cancels
// nothing, even when the daemon takes a moment to close its stream.
func TestDisconnectAfterPauseLeavesRun(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))
	sc := func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(started("sess-1"))
		send(permissionEv(model, "int-1", ptr("shell")))
		send(finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED}))
		time.Sleep(150 * time.Millisecond)
		return nil
	}
	e.d.set(sc, sc)
	_, body, _ := e.chat(t, userBody("$ ls"))
	if chunks, _ := parseStream(t, body); finishOf(chunks) != "tool_calls" {
		t.Fatal(body)
	}
	if err := e.d.waitEnded(t); err != nil {
		t.Errorf("the paused run's daemon call was cancelled: %v", err)
	}
}

// TestServerTimeoutsDoNotCutStreams: the gateway's http.Server has read and
// write timeouts; a stream longer than both still completes because the
// adapter clears them for the stream and sets a deadline per write.
func TestServerTimeoutsDoNotCutStreams(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t), func(s *server.Server) { s.ChatSSE = sse.Options{Keepalive: 50 * time.Millisecond} })
	sc := func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(started("sess-1"))
		for range 6 {
			time.Sleep(100 * time.Millisecond)
			if err := send(textEv(model, "tick ")); err != nil {
				return err
			}
		}
		return send(stopEv(model))
	}
	e.d.set(sc, sc)
	hs := httptest.NewUnstartedServer(e.Server.Handler())
	hs.Config.ReadTimeout = 200 * time.Millisecond
	hs.Config.WriteTimeout = 200 * time.Millisecond
	hs.Start()
	defer hs.Close()
	req, _ := http.NewRequest("POST", hs.URL+server.Prefix+"/interns/"+e.InternID+"/chat/completions", strings.NewReader(userBody("x")))
	req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
	res, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("stream cut after %d bytes: %v", len(b), err)
	}
	chunks, _ := parseStream(t, string(b))
	if finishOf(chunks) != "stop" || len(chunks) != 9 {
		t.Errorf("%d chunks:\n%s", len(chunks), b)
	}

	// The Connect door (the console's), in both codecs: the same stream
	// outlives the same timeouts.
	for _, codec := range []connect.ClientOption{connect.WithProtoJSON(), connect.WithClientOptions()} {
		client := cohortv1connect.NewChatServiceClient(hs.Client(), hs.URL+server.Prefix, codec)
		r := connect.NewRequest(&cohortv1.StreamChatCompletionRequest{InternId: e.InternID,
			Messages: []*cohortv1.ChatMessage{{Role: "user", Content: ptr("x")}}})
		r.Header().Set("Authorization", "Bearer "+e.WorkspaceKey)
		st, err := client.StreamChatCompletion(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		n, finish := 0, ""
		for st.Receive() {
			n++
			for _, c := range st.Msg().GetChunk().GetChoices() {
				if c.GetFinishReason() != "" {
					finish = c.GetFinishReason()
				}
			}
		}
		st.Close()
		if err := st.Err(); err != nil || n != 9 || finish != "stop" {
			t.Errorf("connect stream: %d chunks, finish %q, err %v", n, finish, err)
		}
	}
}
