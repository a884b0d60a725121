package runs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/builtinagent"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/remote"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/runs"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// The intern's agent is Cohort's built-in agent on the offline demo model,
// run from this test binary.
func TestMain(m *testing.M) {
	if os.Getenv("RUNS_TEST_AGENT") == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		err := builtinagent.Serve(ctx, builtinagent.Config{Model: builtinagent.DemoModelID, StateDir: os.Getenv("COHORT_AGENT_STATE_DIR"),
			Logger: slog.New(slog.DiscardHandler), Version: "test"}, os.Stdin, os.Stdout)
		if err != nil && err != context.Canceled {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const wait = time.Minute

// fixture is a gateway (real database) whose intern's daemon runs in
// process, registered as a remote daemon, and a second gateway replica on
// the same database.
type fixture struct {
	e       *testenv.Env
	replica *httptest.Server
	prov    *provision.Provisioner
}

func newFixture(t testing.TB, db *bun.DB, cfg func(*runs.Config)) *fixture {
	t.Helper()
	return newFixtureDaemon(t, db, cfg, 0)
}

// newFixtureDaemon is newFixture with the daemon's interaction deadline
// (0: its default).
func newFixtureDaemon(t testing.TB, db *bun.DB, cfg func(*runs.Config), deadline time.Duration) *fixture {
	t.Helper()
	e := testenv.New(t, db, func(s *server.Server) {
		if cfg != nil {
			cfg(&s.Runs.Config)
		}
	})
	const secret = "daemon-secret-0123456789abcdef0123456789"
	d, err := internd.New(internd.Config{InternID: e.InternID, Secret: secret, DataDir: t.TempDir(),
		AgentCommand: []string{os.Args[0], "-test.run=^$"}, AgentEnv: []string{"RUNS_TEST_AGENT=1"},
		Model: builtinagent.DemoModelID, InitTimeout: 20 * time.Second, InteractionDeadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	srv := testutil.ServeH2C(t, d.Handler())
	t.Cleanup(func() { srv.Close(); d.Close() })
	prov := &provision.Provisioner{DB: e.DB, KEK: e.Server.KEK, Backend: &remote.Backend{}}
	ctx := context.Background()
	if _, err := e.DB.NewUpdate().Model((*store.Intern)(nil)).Set("state = ?", store.InternProvisioning).Where("id = ?", e.InternID).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Register(ctx, prov, e.InternID, srv.URL, secret); err != nil {
		t.Fatal(err)
	}
	e.Server.Chat.Daemons = prov
	rs := testenv.Server(t, db, e.Server.KEK)
	rs.Chat.Daemons = prov
	f := &fixture{e: e, prov: prov, replica: httptest.NewServer(rs.Handler())}
	t.Cleanup(f.replica.Close)
	return f
}

func (f *fixture) do(t testing.TB, method, path, key, body string) (int, string, http.Header) {
	t.Helper()
	return f.e.Do(t, method, path, key, "application/json", body)
}

func (f *fixture) start(t testing.TB, body string) map[string]any {
	t.Helper()
	st, out, _ := f.do(t, "POST", "/interns/"+f.e.InternID+"/chat/completions", f.e.WorkspaceKey, body)
	if st != http.StatusAccepted {
		t.Fatalf("background start: %d %s", st, out)
	}
	return object(t, out)
}

func object(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
	return m
}

func (f *fixture) get(t *testing.T, id string) map[string]any {
	t.Helper()
	st, out, _ := f.do(t, "GET", "/interns/"+f.e.InternID+"/runs/"+id, f.e.WorkspaceKey, "")
	if st != 200 {
		t.Fatalf("get run: %d %s", st, out)
	}
	return object(t, out)
}

func (f *fixture) waitStatus(t *testing.T, id, status string) map[string]any {
	t.Helper()
	var r map[string]any
	testutil.Eventually(t, wait, "run "+status, func() bool {
		r = f.get(t, id)
		return r["status"] == status
	})
	return r
}

type event struct {
	id   int64
	data string
}

// events reads a run's event stream from base (a gateway's URL) to its
// end, sending Last-Event-ID when lastID is not "".
func events(t testing.TB, base, key, intern, id, query, lastID string) []event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+server.Prefix+"/interns/"+intern+"/runs/"+id+"/events"+query, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	var out []event
	var cur event
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			cur.id, err = strconv.ParseInt(line[4:], 10, 64)
			if err != nil {
				t.Fatalf("id line %q", line)
			}
		case line == "data: [DONE]":
			return out
		case strings.HasPrefix(line, "data: "):
			cur.data = line[6:]
			if cur.id == 0 {
				t.Fatalf("a chunk without an id: %s", line)
			}
			out = append(out, cur)
			cur = event{}
		}
	}
	t.Fatalf("the stream ended without [DONE] after %d events: %v", len(out), sc.Err())
	return nil
}

// contiguous checks ids from..from+len-1 in order.
func contiguous(t *testing.T, evs []event, from int64) {
	t.Helper()
	for i, ev := range evs {
		if ev.id != from+int64(i) {
			t.Fatalf("event %d has id %d, want %d", i, ev.id, from+int64(i))
		}
	}
}

func sseChunks(t *testing.T, body string) []string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok && d != "[DONE]" {
			out = append(out, d)
		}
	}
	return out
}

// summary is what a response says, whatever the daemon merged: the
// roles, the text and reasoning, the finishes and the final chunk.
func summary(t *testing.T, chunks []string) string {
	t.Helper()
	var roles, content, reasoning, finishes, final []string
	for _, d := range chunks {
		var c struct {
			Choices []struct {
				Delta struct {
					Role      *string `json:"role"`
					Content   *string `json:"content"`
					Reasoning *string `json:"reasoning"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) == 0 {
			final = append(final, string(c.Usage))
			continue
		}
		ch := c.Choices[0]
		if ch.Delta.Role != nil {
			roles = append(roles, *ch.Delta.Role)
		}
		if ch.Delta.Content != nil {
			content = append(content, *ch.Delta.Content)
		}
		if ch.Delta.Reasoning != nil {
			reasoning = append(reasoning, *ch.Delta.Reasoning)
		}
		if ch.FinishReason != nil {
			finishes = append(finishes, *ch.FinishReason)
		}
	}
	return fmt.Sprintf("roles %v content %q reasoning %q finishes %v final %v", roles, strings.Join(content, ""), strings.Join(reasoning, ""), finishes, final)
}

func bg(prompt string, extra ...string) string {
	b, _ := json.Marshal(prompt)
	return `{"stream":true,"background":true` + join(extra) + `,"messages":[{"role":"user","content":` + string(b) + `}]}`
}

func streamed(prompt string) string {
	b, _ := json.Marshal(prompt)
	return `{"stream":true,"messages":[{"role":"user","content":` + string(b) + `}]}`
}

func answer(session, callID, content string, extra ...string) string {
	s, _ := json.Marshal(session)
	id, _ := json.Marshal(callID)
	c, _ := json.Marshal(content)
	return `{"stream":true,"session_id":` + string(s) + join(extra) + `,"messages":[{"role":"tool","tool_call_id":` + string(id) + `,"content":` + string(c) + `}]}`
}

func join(extra []string) string {
	if len(extra) == 0 {
		return ""
	}
	return "," + strings.Join(extra, ",")
}

// A background turn answers 202 with the run at once and completes with
// no connection; its chunks read back from any replica, from the start
// or from a sequence number, are the chunks the streamed request would
// have sent.
func TestBackgroundRun(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixture(t, db, nil)
		e := f.e
		r := f.start(t, bg("hello there"))
		id, _ := r["id"].(string)
		if !strings.HasPrefix(id, "run_") || r["object"] != "intern.run" || r["intern_id"] != e.InternID || r["session_id"] == nil {
			t.Fatalf("202 body: %v", r)
		}
		session := r["session_id"].(string)
		// Read through the other replica, while the run goes on or after.
		evs := events(t, f.replica.URL, e.WorkspaceKey, e.InternID, id, "", "")
		contiguous(t, evs, 1)
		done := f.waitStatus(t, id, "completed")
		if done["usage"] == nil || done["ended_at"] == nil || done["error"] != nil || int64(done["last_event_id"].(float64)) != int64(len(evs)) {
			t.Fatalf("completed run: %v (%d events)", done, len(evs))
		}
		last := object(t, evs[len(evs)-1].data)
		if last["session_id"] != session || last["usage"] == nil {
			t.Fatalf("final chunk: %s", evs[len(evs)-1].data)
		}
		// The same chunks as a streamed request's, but for ids and times.
		st, body, _ := f.do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey, streamed("hello there"))
		if st != 200 {
			t.Fatalf("streamed: %d %s", st, body)
		}
		var bgData []string
		for _, ev := range evs {
			bgData = append(bgData, ev.data)
		}
		if a, b := summary(t, sseChunks(t, body)), summary(t, bgData); a != b {
			t.Fatalf("streamed %s\nbackground %s", a, b)
		}
		// Resuming: after a sequence number, by query or Last-Event-ID
		// (which wins); after the last one only the end.
		got := events(t, e.HTTP.URL, e.WorkspaceKey, e.InternID, id, "?after=2", "")
		contiguous(t, got, 3)
		if len(got) != len(evs)-2 || got[0].data != evs[2].data {
			t.Fatalf("after=2: %d events", len(got))
		}
		got = events(t, e.HTTP.URL, e.WorkspaceKey, e.InternID, id, "?after=1", strconv.Itoa(len(evs)-1))
		if len(got) != 1 || got[0].id != int64(len(evs)) {
			t.Fatalf("Last-Event-ID: %v", got)
		}
		if got := events(t, e.HTTP.URL, e.WorkspaceKey, e.InternID, id, "?after="+strconv.Itoa(len(evs)), ""); len(got) != 0 {
			t.Fatalf("after the last: %v", got)
		}
		// An EventSource's reconnect after the end: 204, which stops it
		// (without it, each reconnect got 200 and [DONE] again).
		for _, last := range []int{len(evs), len(evs) + 5} {
			req, _ := http.NewRequest("GET", e.HTTP.URL+server.Prefix+"/interns/"+e.InternID+"/runs/"+id+"/events", nil)
			req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
			req.Header.Set("Last-Event-ID", strconv.Itoa(last))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			out, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusNoContent || len(out) != 0 {
				t.Fatalf("reconnect after the end (Last-Event-ID %d): %d %q", last, res.StatusCode, out)
			}
		}
		st, out, _ := f.do(t, "GET", "/interns/"+e.InternID+"/runs/"+id+"/events?after=x", e.WorkspaceKey, "")
		if st != 400 || testenv.ErrorShape(400, out) != nil {
			t.Fatalf("bad after: %d %s", st, out)
		}
		// The session lists it.
		st, out, _ = f.do(t, "GET", "/interns/"+e.InternID+"/sessions/"+session+"/runs", e.WorkspaceKey, "")
		var list struct {
			Object string           `json:"object"`
			Data   []map[string]any `json:"data"`
		}
		if json.Unmarshal([]byte(out), &list); st != 200 || list.Object != "list" || len(list.Data) != 1 || list.Data[0]["id"] != id {
			t.Fatalf("list: %d %s", st, out)
		}

		// Scoped as chat is: another workspace's key, another intern, an
		// unknown run are all 404.
		ws, err := e.Server.Workspaces.Create(context.Background(), auth.Operator(e.OrganizationID), &cohortv1.CreateWorkspaceRequest{Name: ptr("other")})
		if err != nil {
			t.Fatal(err)
		}
		other := e.NewKey(t, store.KeyWorkspace, ws.GetId())
		for _, c := range []struct{ key, path string }{
			{other, "/interns/" + e.InternID + "/runs/" + id},
			{other, "/interns/" + e.InternID + "/runs/" + id + "/events"},
			{other, "/interns/" + e.InternID + "/sessions/" + session + "/runs"},
			{e.WorkspaceKey, "/interns/" + e.InternID + "/runs/run_nope"},
			{e.WorkspaceKey, "/interns/nope/runs/" + id},
		} {
			st, out, _ := f.do(t, "GET", c.path, c.key, "")
			if st != 404 || testenv.ErrorShape(404, out) != nil {
				t.Fatalf("%s: %d %s", c.path, st, out)
			}
		}
		if st, out, _ := f.do(t, "POST", "/interns/"+e.InternID+"/runs/"+id+"/cancel", other, ""); st != 404 {
			t.Fatalf("cancel from another workspace: %d %s", st, out)
		}
		if st, _, _ := f.do(t, "GET", "/interns/"+e.InternID+"/runs/"+id, "", ""); st != 401 {
			t.Fatalf("no key: %d", st)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// A background run that asks a question pauses with the question in the
// run; the usual tool message answers it (202: it goes on in the
// background) and the run completes, one event stream across both.
// Cancel ends a paused run at once; an ended run cannot be cancelled.
func TestBackgroundPause(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixture(t, db, nil)
		e := f.e
		r := f.start(t, bg("shall we?"))
		id, session := r["id"].(string), r["session_id"].(string)
		p := f.waitStatus(t, id, "paused")
		ia, _ := p["pending_interaction"].(map[string]any)
		fn, _ := ia["function"].(map[string]any)
		if ia["id"] == nil || fn["name"] != "service.provide_input" || p["pause_deadline"] == nil || p["ended_at"] != nil {
			t.Fatalf("paused run: %v", p)
		}
		st, out, _ := f.do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey,
			answer(session, ia["id"].(string), `{"action":"accept","content":{"answer":"yes"}}`))
		if st != http.StatusAccepted || object(t, out)["id"] != id {
			t.Fatalf("answer: %d %s", st, out)
		}
		done := f.waitStatus(t, id, "completed")
		if done["pending_interaction"] != nil || done["usage"] == nil {
			t.Fatalf("completed: %v", done)
		}
		evs := events(t, f.replica.URL, e.WorkspaceKey, e.InternID, id, "", "")
		contiguous(t, evs, 1)
		var finishes []string
		for _, ev := range evs {
			c := object(t, ev.data)
			if ch, _ := c["choices"].([]any); len(ch) > 0 {
				if fr, ok := ch[0].(map[string]any)["finish_reason"].(string); ok {
					finishes = append(finishes, fr)
				}
			}
		}
		if strings.Join(finishes, ",") != "tool_calls,stop" || !strings.Contains(joinData(evs), "yes") {
			t.Fatalf("finishes %v in %s", finishes, joinData(evs))
		}

		// Cancel while paused: at once, and for good.
		r = f.start(t, bg("again?"))
		id2 := r["id"].(string)
		p = f.waitStatus(t, id2, "paused")
		st, out, _ = f.do(t, "POST", "/interns/"+e.InternID+"/runs/"+id2+"/cancel", e.WorkspaceKey, "")
		c := object(t, out)
		errObj, _ := c["error"].(map[string]any)
		if st != 200 || c["status"] != "cancelled" || errObj["code"] != float64(410) || c["ended_at"] == nil {
			t.Fatalf("cancel: %d %s", st, out)
		}
		st, out, _ = f.do(t, "POST", "/interns/"+e.InternID+"/runs/"+id2+"/cancel", e.WorkspaceKey, "")
		if st != 409 || testenv.ErrorShape(409, out) != nil || !strings.Contains(out, "run_ended") {
			t.Fatalf("cancel again: %d %s", st, out)
		}
		// The daemon's run was cancelled too: the question is no longer
		// pending.
		ia = p["pending_interaction"].(map[string]any)
		st, out, _ = f.do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey, answer(r["session_id"].(string), ia["id"].(string), `{"action":"accept","content":{"answer":"x"}}`))
		if st != 409 || !strings.Contains(out, "interaction_not_pending") {
			t.Fatalf("answer to a cancelled run: %d %s", st, out)
		}
		evs = events(t, e.HTTP.URL, e.WorkspaceKey, e.InternID, id2, "", "")
		contiguous(t, evs, 1)
	})
}

func joinData(evs []event) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString(ev.data)
		b.WriteByte('\n')
	}
	return b.String()
}

// The cap on running background runs per workspace: at the bound a run
// starts, one past it is 429 with Retry-After in the spec's error shape
// (a streamed turn is not counted); cancelling a running run makes room.
// Background turns count against the turn rate as streamed ones do.
func TestBackgroundLimits(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixture(t, db, func(c *runs.Config) { c.MaxRunning = 2 })
		e := f.e
		var ids []string
		for range 2 {
			ids = append(ids, f.start(t, bg("$ sleep 120"))["id"].(string))
		}
		st, out, h := f.do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey, bg("one too many"))
		if st != 429 || testenv.ErrorShape(429, out) != nil || !strings.Contains(out, "rate_limited") || h.Get("Retry-After") == "" {
			t.Fatalf("past the cap: %d %s %v", st, out, h)
		}
		if st, out, _ := f.do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey, streamed("not counted")); st != 200 {
			t.Fatalf("streamed at the cap: %d %s", st, out)
		}
		st, out, _ = f.do(t, "POST", "/interns/"+e.InternID+"/runs/"+ids[0]+"/cancel", e.WorkspaceKey, "")
		// Asked to stop, or stopped already (then nothing is requested any
		// more: a record says only what is true).
		if c := object(t, out); st != 200 || (c["cancel_requested"] != true && c["status"] != "cancelled") || (c["status"] == "cancelled" && c["cancel_requested"] != false) {
			t.Fatalf("cancel running: %d %s", st, out)
		}
		c := f.waitStatus(t, ids[0], "cancelled")
		if errObj, _ := c["error"].(map[string]any); errObj["code"] != float64(410) {
			t.Fatalf("cancelled: %v", c)
		}
		evs := events(t, e.HTTP.URL, e.WorkspaceKey, e.InternID, ids[0], "", "")
		if last := evs[len(evs)-2].data; !strings.Contains(last, `"finish_reason":"error"`) || !strings.Contains(last, "run_ended") {
			t.Fatalf("a cancelled run's stream ends with its error: %s", last)
		}
		ids[0] = f.start(t, bg("room again"))["id"].(string)
		f.waitStatus(t, ids[0], "completed")
		f.do(t, "POST", "/interns/"+e.InternID+"/runs/"+ids[1]+"/cancel", e.WorkspaceKey, "")
		f.waitStatus(t, ids[1], "cancelled")

		// The turn rate: a limiter allowing one more turn lets one
		// background turn through and refuses the next, as it would a
		// streamed one.
		lim, err := ratelimit.NewMemory(ratelimit.PerMinute(1), nil)
		if err != nil {
			t.Fatal(err)
		}
		e.Server.Chat.Limiter = lim
		f.start(t, bg("within the rate"))
		st, out, h = f.do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey, bg("past the rate"))
		if st != 429 || !strings.Contains(out, "rate_limited") || h.Get("Retry-After") == "" {
			t.Fatalf("past the rate: %d %s", st, out)
		}
	})
}

// notes is a RunNotifier that records what it is told, reading the run's
// row through the transaction it is given: the change is visible there.
type notes struct {
	mu  sync.Mutex
	got []string
}

func (n *notes) RunChanged(ctx context.Context, db bun.IDB, workspaceID, eventType string, run json.RawMessage) error {
	var o map[string]any
	if err := json.Unmarshal(run, &o); err != nil {
		return err
	}
	var status string
	if err := db.NewSelect().Model((*store.Run)(nil)).Column("status").Where("id = ?", o["id"]).Scan(ctx, &status); err != nil {
		return err
	}
	if "run."+status != eventType || o["status"] != status {
		return fmt.Errorf("told %s of run %v with row status %s", eventType, o, status)
	}
	ia, _ := o["pending_interaction"].(map[string]any)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.got = append(n.got, fmt.Sprintf("%s %s pending=%v", workspaceID, eventType, ia["id"] != nil))
	return nil
}

func (n *notes) list() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.got...)
}

// The Connect door starts a background run with one message carrying the
// run; the RunNotifier hears of each status change inside its transaction
// (a pause with the interaction to answer).
func TestBackgroundConnectAndNotifier(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		n := &notes{}
		f := newFixture(t, db, nil)
		e := f.e
		e.Server.Runs.Notifier = n
		client := cohortv1connect.NewChatServiceClient(e.HTTPClient(), e.URL)
		req := connect.NewRequest(&cohortv1.StreamChatCompletionRequest{InternId: e.InternID, Background: true,
			Messages: []*cohortv1.ChatMessage{{Role: "user", Content: ptr("ready?")}}})
		req.Header().Set("Authorization", "Bearer "+e.WorkspaceKey)
		s, err := client.StreamChatCompletion(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		var msgs []*cohortv1.StreamChatCompletionResponse
		for s.Receive() {
			msgs = append(msgs, s.Msg())
		}
		if s.Err() != nil || len(msgs) != 1 || msgs[0].GetRun().GetStatus() != "running" || msgs[0].GetChunk() != nil {
			t.Fatalf("connect background: %v %v", msgs, s.Err())
		}
		run := msgs[0].GetRun()
		p := f.waitStatus(t, run.GetId(), "paused")
		ia := p["pending_interaction"].(map[string]any)
		st, out, _ := f.do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey,
			answer(run.GetSessionId(), ia["id"].(string), `{"action":"decline"}`))
		if st != http.StatusAccepted {
			t.Fatalf("answer: %d %s", st, out)
		}
		f.waitStatus(t, run.GetId(), "completed")
		want := []string{e.WorkspaceID + " run.paused pending=true", e.WorkspaceID + " run.completed pending=false"}
		if got := n.list(); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("notifications %v, want %v", got, want)
		}
	})
}

// The bounds of stored chunks: past a run's cap its deltas are dropped but
// the chunks that end it are kept (and the run says so); an ended run
// past the retention is deleted with its chunks.
func TestBackgroundEventBounds(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixture(t, db, func(c *runs.Config) { c.MaxEventBytes = 600; c.Retention = time.Millisecond })
		e := f.e
		id := f.start(t, bg("a prompt long enough to make a reply of several chunks"))["id"].(string)
		r := f.waitStatus(t, id, "completed")
		evs := events(t, e.HTTP.URL, e.WorkspaceKey, e.InternID, id, "", "")
		contiguous(t, evs, 1)
		if r["events_truncated"] != true || int64(r["last_event_id"].(float64)) != int64(len(evs)) {
			t.Fatalf("truncated run: %v", r)
		}
		if fin := evs[len(evs)-2].data; !strings.Contains(fin, `"finish_reason":"stop"`) || !strings.Contains(evs[len(evs)-1].data, `"choices":[]`) {
			t.Fatalf("the ending chunks are kept: %s", joinData(evs))
		}
		var size int
		for _, ev := range evs[:len(evs)-2] {
			size += len(ev.data)
		}
		if size > 600 {
			t.Fatalf("%d bytes of deltas kept past a cap of 600", size)
		}
		// Retention: the sweep deletes the ended run and its chunks.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go e.Server.Runs.Run(ctx)
		testutil.Eventually(t, wait, "the ended run is deleted", func() bool {
			st, _, _ := f.do(t, "GET", "/interns/"+e.InternID+"/runs/"+id, e.WorkspaceKey, "")
			return st == 404
		})
		if n, err := db.NewSelect().Model((*store.RunEvent)(nil)).Where("run_id = ?", id).Count(ctx); err != nil || n != 0 {
			t.Fatalf("%d chunks left (%v)", n, err)
		}
	})
}

// A paused run whose question's deadline passed (the daemon has cancelled
// it) is cancelled here too, with the daemon's reason.
func TestBackgroundPauseExpires(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixtureDaemon(t, db, func(c *runs.Config) { c.PauseGrace, c.Lease = time.Millisecond, time.Second }, time.Second)
		e := f.e
		id := f.start(t, bg("still there?"))["id"].(string)
		f.waitStatus(t, id, "paused")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go e.Server.Runs.Run(ctx)
		r := f.waitStatus(t, id, "cancelled")
		if errObj, _ := r["error"].(map[string]any); errObj["code"] != float64(410) || !strings.Contains(errObj["message"].(string), "deadline") {
			t.Fatalf("expired: %v", r)
		}
	})
}

func (n *notes) Notify() {}

// TestBackgroundRunRecordIsTrue polls a run tightly from its start through
// its pause to the expiry of its question, under the default settings: a
// poll never shows a question or a deadline on a run that is not paused,
// nor a pending cancel on one that has ended, and the run ends within a
// second of its question's deadline (it stayed paused up to 40 s after).
func TestBackgroundRunRecordIsTrue(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixtureDaemon(t, db, nil, 2*time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go f.e.Server.Runs.Run(ctx)
		id := f.start(t, bg("still there?"))["id"].(string)
		var deadline time.Time
		var r map[string]any
		for began := time.Now(); time.Since(began) < wait; {
			r = f.get(t, id)
			status, _ := r["status"].(string)
			if status != "paused" && (r["pending_interaction"] != nil || r["pause_deadline"] != nil) {
				t.Fatalf("a %s run shows a question: %v", status, r)
			}
			if status == "paused" && (r["pending_interaction"] == nil || r["pause_deadline"] == nil) {
				t.Fatalf("a paused run without its question: %v", r)
			}
			if status == "paused" && deadline.IsZero() {
				var err error
				if deadline, err = time.Parse(time.RFC3339Nano, r["pause_deadline"].(string)); err != nil {
					t.Fatal(err)
				}
			}
			if status == "completed" || status == "failed" || status == "cancelled" {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if r["status"] != "cancelled" || r["cancel_requested"] != false {
			t.Fatalf("the run's end: %v", r)
		}
		if ended, err := time.Parse(time.RFC3339Nano, r["ended_at"].(string)); err != nil || ended.Sub(deadline) > time.Second {
			t.Fatalf("ended at %v, its question's deadline was %v: later than a second", r["ended_at"], deadline)
		}
	})
}
