package chat_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/chat"
	"github.com/cohort-dev/cohort/internal/metrics"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// stallAfterStart is an agent that never produces anything: the daemon
// sends its Started and then only waits.
func stallAfterStart(ctx context.Context, send func(*interndv1.RunEvent) error) error {
	send(started("sess-1"))
	<-ctx.Done()
	return ctx.Err()
}

// TestFirstEventTimeoutCountsTheAgent: a stalled agent gets the caller the
// spec's 504 timeout before the stream opens, at the first-event bound,
// although the daemon's Started arrived at once; the run is cancelled.
func TestFirstEventTimeoutCountsTheAgent(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t), func(s *server.Server) {
		s.Chat.FirstEventTimeout = 300 * time.Millisecond
		// Long enough that the old behaviour (an open, silent stream) shows.
		s.Chat.EventTimeout = 5 * time.Second
	})
	e.d.set(stallAfterStart, stallAfterStart)
	began := time.Now()
	status, body, hdr := e.chat(t, userBody("x"))
	took := time.Since(began)
	wantRefusal(t, status, body, 504, "timeout")
	if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want a JSON error", ct)
	}
	if took < 300*time.Millisecond || took > 3*time.Second {
		t.Errorf("answered after %v, want the 300ms bound", took)
	}
	if err := e.d.waitEnded(t); err == nil {
		t.Error("the daemon call was not cancelled")
	}
}

// TestTurnTimeout: an agent that keeps talking past the turn deadline gets
// an error chunk 504 timeout, and the daemon call is cancelled.
func TestTurnTimeout(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t), func(s *server.Server) { s.Chat.TurnTimeout = 500 * time.Millisecond })
	chatty := func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(started("sess-1"))
		stop := time.After(5 * time.Second)
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-stop:
				return send(stopEv(model))
			case <-time.After(50 * time.Millisecond):
				send(textEv(model, "."))
			}
		}
	}
	e.d.set(chatty, chatty)
	status, body, _ := e.chat(t, userBody("x"))
	if status != 200 {
		t.Fatal(status, body)
	}
	chunks, _ := parseStream(t, body)
	er := chunks[len(chunks)-2]
	if er.Error == nil || er.Error.Code != 504 || er.Error.Metadata.Reason != "timeout" || !strings.Contains(er.Error.Message, "turn deadline") {
		t.Fatalf("want a turn timeout error chunk, got %s", er.raw)
	}
	if err := e.d.waitEnded(t); err == nil {
		t.Error("the daemon call was not cancelled")
	}
}

// TestRunEndingsCounted: every way a run ends is one count of
// cohort_chat_runs_total with its own outcome label.
func TestRunEndingsCounted(t *testing.T) {
	m := metrics.New(nil)
	e := newEnv(t, storetest.SQLite(t), func(s *server.Server) {
		s.Chat.Observer = m
		s.Chat.FirstEventTimeout = 300 * time.Millisecond
		s.Chat.EventTimeout = 300 * time.Millisecond
		s.Chat.TurnTimeout = time.Second
	})
	silentAfterText := func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(started("sess-1"))
		send(textEv(model, "thinking"))
		<-ctx.Done()
		return ctx.Err()
	}
	chatty := func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(started("sess-1"))
		stop := time.After(5 * time.Second)
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-stop:
				return send(stopEv(model))
			case <-time.After(50 * time.Millisecond):
				send(textEv(model, "."))
			}
		}
	}
	failed := events(nil, started("sess-1"), textEv(model, "x"),
		finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_ERROR, Code: 502, ErrorReason: "turn_failed", Message: "boom"}))
	for _, sc := range []script{
		events(nil, started("sess-1"), textEv(model, "hi"), stopEv(model)),
		events(nil, started("sess-1"), permissionEv(model, "int-1", ptr("shell")), finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED})),
		failed,
		events(refuse(409, "busy")),
		stallAfterStart,
		silentAfterText,
		chatty,
	} {
		e.d.set(sc, sc)
		e.chat(t, userBody("x"))
	}

	// A caller that hangs up mid-stream.
	e.d.set(silentAfterText, silentAfterText)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.URL+"/interns/"+e.InternID+"/chat/completions", strings.NewReader(userBody("x")))
	req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
	res, err := e.HTTPClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := io.ReadAtLeast(res.Body, buf, 10); err != nil {
		t.Fatal(err)
	}
	cancel()
	res.Body.Close()

	want := []string{
		`cohort_chat_runs_total{outcome="stop",reason="none"} 1`,
		`cohort_chat_runs_total{outcome="paused",reason="none"} 1`,
		`cohort_chat_runs_total{outcome="error",reason="turn_failed"} 1`,
		`cohort_chat_runs_total{outcome="refused",reason="busy"} 1`,
		`cohort_chat_runs_total{outcome="first_event_timeout",reason="timeout"} 1`,
		`cohort_chat_runs_total{outcome="event_timeout",reason="timeout"} 1`,
		`cohort_chat_runs_total{outcome="turn_timeout",reason="timeout"} 1`,
		`cohort_chat_runs_total{outcome="caller_gone",reason="client_closed_request"} 1`,
	}
	var text string
	for deadline := time.Now().Add(5 * time.Second); ; {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		text = rec.Body.String()
		missing := 0
		for _, w := range want {
			if !strings.Contains(text, w) {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("missing %s", w)
		}
	}
	var total int
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "cohort_chat_runs_total{") {
			total++
		}
	}
	if total != len(want) {
		t.Errorf("%d series of cohort_chat_runs_total, want %d (one per run):\n%s", total, len(want), text)
	}
}

// slowApproved is a daemon's answer to an approved command that runs longer
// than the request budget: Started (a continuation) at once, then nothing
// until the command ends.
func slowApproved(took time.Duration) script {
	return func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		ev := started("sess-1")
		ev.GetStarted().Continuation = true
		if err := send(ev); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(took):
		}
		if err := send(textEv(model, "slow-done")); err != nil {
			return err
		}
		return send(stopEv(model))
	}
}

// TestApprovedCommandKeepsItsStream: once the intern accepts an answer, the
// run continues on an open stream; the request budget, which bounds a new
// turn until the agent's first event, does not apply, so a command approved
// in manual mode that runs past it streams its result instead of 504. Both
// doors.
func TestApprovedCommandKeepsItsStream(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t), func(s *server.Server) {
		s.Chat.FirstEventTimeout = 300 * time.Millisecond
		s.Chat.EventTimeout = 10 * time.Second
	})
	e.d.set(stallAfterStart, slowApproved(time.Second))

	t.Run("rest", func(t *testing.T) {
		status, body, _ := e.chat(t, toolBody("sess-1", "call_1", "allow_once"))
		if status != 200 {
			t.Fatalf("status %d: %s", status, body)
		}
		chunks, _ := parseStream(t, body)
		if finishOf(chunks) != "stop" || !strings.Contains(body, "slow-done") {
			t.Fatalf("want the command's result and stop, got %s", body)
		}
	})
	t.Run("connect", func(t *testing.T) {
		req, err := chat.DecodeRequest([]byte(toolBody("sess-1", "call_1", "allow_once")))
		if err != nil {
			t.Fatal(err)
		}
		req.InternId = e.InternID
		chunks, err := connectStream(e, e.WorkspaceKey, req)
		if err != nil {
			t.Fatalf("the Connect door refused an accepted answer: %v", err)
		}
		var text string
		for _, c := range chunks {
			for _, ch := range c.GetChoices() {
				text += ch.GetDelta().GetContent()
			}
		}
		if text != "slow-done" {
			t.Fatalf("text %q, want the command's result", text)
		}
	})
	// A new turn whose agent stays silent is still refused at the budget.
	t.Run("new turn still bounded", func(t *testing.T) {
		status, body, _ := e.chat(t, userBody("x"))
		wantRefusal(t, status, body, 504, "timeout")
	})
}
