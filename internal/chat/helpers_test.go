package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/lookahead"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// script plays one daemon call: it sends events and returns the call's
// result (nil, or a Connect error as the real daemon would return it).
type script func(ctx context.Context, send func(*interndv1.RunEvent) error) error

// daemon is a scripted InternDaemonService served over h2c: a stand-in for
// the intern's remote process, so the orchestration is exercised through a
// real Connect client, real HTTP/2 streams and real cancellation.
type daemon struct {
	mu      sync.Mutex
	start   script
	answer  script
	starts  []*interndv1.StartTurnRequest
	answers []*interndv1.AnswerRequest
	// ended receives the context error of each call when it returns.
	ended chan error

	srv    *httptest.Server
	client interndv1connect.InternDaemonServiceClient
}

func newDaemon(t testing.TB, opts ...connect.ClientOption) *daemon {
	d := &daemon{ended: make(chan error, 100)}
	mux := http.NewServeMux()
	mux.Handle(interndv1connect.NewInternDaemonServiceHandler(d))
	d.srv = httptest.NewUnstartedServer(mux)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	d.srv.Config.Protocols = &p
	d.srv.Start()
	t.Cleanup(d.srv.Close)
	var cp http.Protocols
	cp.SetUnencryptedHTTP2(true)
	// The provisioner's transport: streams are read through a lookahead.
	d.client = interndv1connect.NewInternDaemonServiceClient(&http.Client{Transport: lookahead.Transport{RoundTripper: &http.Transport{Protocols: &cp}}}, d.srv.URL, opts...)
	return d
}

func (d *daemon) set(start, answer script) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.start, d.answer = start, answer
}

func (d *daemon) calls() (starts []*interndv1.StartTurnRequest, answers []*interndv1.AnswerRequest) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append(starts, d.starts...), append(answers, d.answers...)
}

func (d *daemon) ncalls() int {
	s, a := d.calls()
	return len(s) + len(a)
}

func (d *daemon) StartTurn(ctx context.Context, req *connect.Request[interndv1.StartTurnRequest], out *connect.ServerStream[interndv1.StartTurnResponse]) error {
	d.mu.Lock()
	d.starts = append(d.starts, req.Msg)
	sc := d.start
	d.mu.Unlock()
	defer func() { d.ended <- ctx.Err() }()
	if sc == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("no script"))
	}
	return sc(ctx, func(ev *interndv1.RunEvent) error { return out.Send(&interndv1.StartTurnResponse{Event: ev}) })
}

func (d *daemon) Answer(ctx context.Context, req *connect.Request[interndv1.AnswerRequest], out *connect.ServerStream[interndv1.AnswerResponse]) error {
	d.mu.Lock()
	d.answers = append(d.answers, req.Msg)
	sc := d.answer
	d.mu.Unlock()
	defer func() { d.ended <- ctx.Err() }()
	if sc == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("no script"))
	}
	return sc(ctx, func(ev *interndv1.RunEvent) error { return out.Send(&interndv1.AnswerResponse{Event: ev}) })
}

func (d *daemon) Attach(context.Context, *connect.Request[interndv1.AttachRequest], *connect.ServerStream[interndv1.AttachResponse]) error {
	return connect.NewError(connect.CodeUnimplemented, errors.New("not scripted"))
}

func (d *daemon) Cancel(context.Context, *connect.Request[interndv1.CancelRequest]) (*connect.Response[interndv1.CancelResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("not scripted"))
}

func (d *daemon) Status(context.Context, *connect.Request[interndv1.StatusRequest]) (*connect.Response[interndv1.StatusResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("not scripted"))
}

// daemons implements turn.Daemons with the scripted daemon, or an error.
type daemons struct {
	d   *daemon
	err error
}

func (x daemons) ClientFor(in *store.Intern) (interndv1connect.InternDaemonServiceClient, error) {
	if x.err != nil {
		return nil, x.err
	}
	return x.d.client, nil
}

// Wake wakes nobody: a sleeping intern stays asleep.
func (x daemons) Wake(ctx context.Context, in *store.Intern) (*store.Intern, error) { return in, nil }

// Events the scripts send.
func started(session string) *interndv1.RunEvent {
	return &interndv1.RunEvent{Seq: 1, RunId: "run-1", Event: &interndv1.RunEvent_Started{Started: &interndv1.Started{SessionId: session, RunId: "run-1"}}}
}

func textEv(model, s string) *interndv1.RunEvent {
	return &interndv1.RunEvent{Model: model, Event: &interndv1.RunEvent_Text{Text: &interndv1.TextDelta{Text: s}}}
}

func reasoningEv(model, s string) *interndv1.RunEvent {
	return &interndv1.RunEvent{Model: model, Event: &interndv1.RunEvent_Reasoning{Reasoning: &interndv1.ReasoningDelta{Text: s}}}
}

func usageEv(model string, u *interndv1.Usage) *interndv1.RunEvent {
	return &interndv1.RunEvent{Model: model, Event: &interndv1.RunEvent_Usage{Usage: u}}
}

func finishedEv(model string, f *interndv1.Finished) *interndv1.RunEvent {
	return &interndv1.RunEvent{Model: model, Event: &interndv1.RunEvent_Finished{Finished: f}}
}

func stopEv(model string) *interndv1.RunEvent {
	return finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_STOP})
}

func permissionEv(model, id string, op *string) *interndv1.RunEvent {
	return &interndv1.RunEvent{Model: model, Event: &interndv1.RunEvent_Interaction{Interaction: &interndv1.Interaction{Id: id,
		Kind: &interndv1.Interaction_Permission{Permission: &interndv1.Permission{Operation: op,
			Options: []string{"allow_once", "allow_always", "reject_once", "reject_always"}}}}}}
}

func shellPermissionEv(model, id, title, input string) *interndv1.RunEvent {
	ev := permissionEv(model, id, ptr("shell"))
	p := ev.GetInteraction().GetPermission()
	p.Title, p.Input = title, input
	return ev
}

func questionEv(model, id string) *interndv1.RunEvent {
	return &interndv1.RunEvent{Model: model, Event: &interndv1.RunEvent_Interaction{Interaction: &interndv1.Interaction{Id: id,
		Kind: &interndv1.Interaction_Question{Question: &interndv1.Question{Message: "Which colour?",
			Fields: []*interndv1.Field{{Name: "colour", Type: "string", Required: true, Options: []string{"red", "blue"}}, {Name: "note", Type: "string"}}}}}}}
}

// events returns a script sending evs and then returning ret.
func events(ret error, evs ...*interndv1.RunEvent) script {
	return func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return err
			}
		}
		return ret
	}
}

// refuse is a daemon error as the daemon sends it: a Connect error with a
// cohort.v1.ErrorDetail.
func refuse(status int, reason apierr.Reason) error {
	return apierr.ToConnect(apierr.New(status, reason, "daemon says %s", reason))
}

// env is a gateway over a real database with the scripted daemon behind it.
type env struct {
	*testenv.Env
	d *daemon
}

var fixed = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func newEnv(t testing.TB, db *bun.DB, configure ...func(*server.Server)) *env {
	t.Helper()
	d := newDaemon(t)
	base := func(s *server.Server) {
		s.Chat.Daemons = daemons{d: d}
		s.Chat.NewID = func() string { return "chatcmpl-test" }
		s.Chat.Now = func() time.Time { return fixed }
	}
	e := &env{Env: testenv.New(t, db, append([]func(*server.Server){base}, configure...)...), d: d}
	e.setState(t, store.InternRunning)
	return e
}

func (e *env) setState(t testing.TB, state string) {
	t.Helper()
	if _, err := e.DB.NewUpdate().Model((*store.Intern)(nil)).Set("state = ?", state).Where("id = ?", e.InternID).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (e *env) post(t testing.TB, key, internID, body string) (int, string, http.Header) {
	t.Helper()
	return e.Do(t, "POST", "/interns/"+internID+"/chat/completions", key, "application/json", body)
}

// chat posts body with the workspace key to the demo intern.
func (e *env) chat(t testing.TB, body string) (int, string, http.Header) {
	t.Helper()
	return e.post(t, e.WorkspaceKey, e.InternID, body)
}

// userBody is a request whose last message is a user prompt.
func userBody(prompt string, extra ...string) string {
	p, _ := json.Marshal(prompt)
	return `{"model":"anything","stream":true` + strings.Join(extra, "") + `,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":` + string(p) + `}]}`
}

// toolBody answers interaction id in session sid.
func toolBody(sid, id, answer string) string {
	a, _ := json.Marshal(answer)
	i, _ := json.Marshal(id)
	s, _ := json.Marshal(sid)
	return `{"stream":true,"session_id":` + string(s) + `,"messages":[{"role":"user","content":"ls"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":` + string(i) + `,"type":"function","function":{"name":"service.provide_input","arguments":"{}"}}]},` +
		`{"role":"tool","tool_call_id":` + string(i) + `,"content":` + string(a) + `}]}`
}

// errorBody is the parsed refusal body.
type errorBody struct {
	Error struct {
		Code     int             `json:"code"`
		Message  string          `json:"message"`
		Metadata json.RawMessage `json:"metadata"`
	} `json:"error"`
}

// wantRefusal checks a refusal's status and exact body shape: code equals
// the status, a message, and metadata {"reason"} exactly when reason is set.
func wantRefusal(t testing.TB, status int, body string, wantStatus int, reason string) errorBody {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status %d, want %d; body %s", status, wantStatus, body)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &top); err != nil || len(top) != 1 {
		t.Fatalf("body %s is not {\"error\":...}", body)
	}
	var inner map[string]json.RawMessage
	json.Unmarshal(top["error"], &inner)
	wantKeys := 2
	if reason != "" {
		wantKeys = 3
	}
	if len(inner) != wantKeys {
		t.Errorf("error object %s has %d keys, want %d", top["error"], len(inner), wantKeys)
	}
	var eb errorBody
	json.Unmarshal([]byte(body), &eb)
	if eb.Error.Code != wantStatus || eb.Error.Message == "" {
		t.Errorf("body %s", body)
	}
	if reason == "" {
		if eb.Error.Metadata != nil {
			t.Errorf("metadata present on a %d: %s", wantStatus, body)
		}
	} else if string(eb.Error.Metadata) != `{"reason":"`+reason+`"}` {
		t.Errorf("metadata %s, want reason %s", eb.Error.Metadata, reason)
	}
	return eb
}

// chunk is a parsed chunk; raw keeps the keys present.
type chunk struct {
	raw     map[string]json.RawMessage
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		FinishReason *string `json:"finish_reason"`
		Delta        struct {
			Role      *string `json:"role"`
			Content   *string `json:"content"`
			Reasoning *string `json:"reasoning"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Error *struct {
		Code     int    `json:"code"`
		Message  string `json:"message"`
		Metadata struct {
			Reason string `json:"reason"`
		} `json:"metadata"`
	} `json:"error"`
	SessionID *string         `json:"session_id"`
	Usage     json.RawMessage `json:"usage"`
}

// parseStream is a strict SSE parser for the chat stream: only `data:`
// lines and `: keepalive` comments, each followed by one blank line; one id;
// role chunk first; `error` only on an error finish; exactly one final chunk
// (empty choices, session_id and usage keys) right after a finish chunk and
// right before `data: [DONE]`, which ends the stream.
func parseStream(t testing.TB, body string) (chunks []chunk, keepalives int) {
	t.Helper()
	if !strings.HasSuffix(body, "\n\ndata: [DONE]\n\n") {
		t.Fatalf("stream does not end with [DONE]:\n%s", body)
	}
	evs := strings.Split(strings.TrimSuffix(body, "data: [DONE]\n\n"), "\n\n")
	evs = evs[:len(evs)-1] // the empty tail after the last blank line
	for i, ev := range evs {
		if strings.Contains(ev, "\n") {
			t.Fatalf("event %d spans lines: %q", i, ev)
		}
		if ev == ": keepalive" {
			keepalives++
			continue
		}
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || data == "[DONE]" {
			t.Fatalf("event %d: %q", i, ev)
		}
		var c chunk
		if err := json.Unmarshal([]byte(data), &c.raw); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		chunks = append(chunks, c)
	}
	if len(chunks) < 3 {
		t.Fatalf("only %d chunks", len(chunks))
	}
	for i, c := range chunks {
		if c.ID != chunks[0].ID || c.Object != "chat.completion.chunk" || c.Model == "" {
			t.Errorf("chunk %d: id %q object %q model %q", i, c.ID, c.Object, c.Model)
		}
		_, hasErr := c.raw["error"]
		_, hasSess := c.raw["session_id"]
		_, hasUsage := c.raw["usage"]
		last := i == len(chunks)-1
		if last != (len(c.Choices) == 0) || hasSess != last || hasUsage != last {
			t.Errorf("chunk %d: choices %d session_id %v usage %v, final %v", i, len(c.Choices), hasSess, hasUsage, last)
		}
		isErr := len(c.Choices) == 1 && c.Choices[0].FinishReason != nil && *c.Choices[0].FinishReason == "error"
		if hasErr != isErr {
			t.Errorf("chunk %d: error key %v, error finish %v", i, hasErr, isErr)
		}
		if isErr && (c.Error.Code == 0 || c.Error.Message == "" || c.Error.Metadata.Reason == "") {
			t.Errorf("chunk %d: incomplete error %s", i, c.raw["error"])
		}
		if i == 0 && (len(c.Choices) != 1 || c.Choices[0].Delta.Role == nil || *c.Choices[0].Delta.Role != "assistant") {
			t.Errorf("first chunk is not the role chunk: %v", c.raw)
		}
		if i > 0 && len(c.Choices) == 1 && c.Choices[0].Delta.Role != nil {
			t.Errorf("chunk %d repeats the role", i)
		}
	}
	pen := chunks[len(chunks)-2]
	if len(pen.Choices) != 1 || pen.Choices[0].FinishReason == nil {
		t.Errorf("the final chunk does not follow a finish chunk")
	}
	return chunks, keepalives
}

// finishOf returns the finish reason of the stream.
func finishOf(chunks []chunk) string {
	pen := chunks[len(chunks)-2]
	return *pen.Choices[0].FinishReason
}

func golden(t testing.TB, path, got string) {
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

func ptr[T any](v T) *T { return &v }

// waitEnded returns the context error the daemon call ended with.
func (d *daemon) waitEnded(t testing.TB) error {
	t.Helper()
	select {
	case err := <-d.ended:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon call did not end")
		return nil
	}
}
