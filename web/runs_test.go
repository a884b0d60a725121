package web_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// runRecord is the REST door's run object, the fields the tests read.
type runRecord struct {
	ID          string `json:"id"`
	SessionID   string `json:"session_id"`
	Status      string `json:"status"`
	LastEventID int64  `json:"last_event_id"`
}

// runRow is a JavaScript expression for the list's row of run id.
func runRow(id string) string {
	return `document.querySelector("#runs-list tr[data-run='` + id + `']")`
}

func getRunREST(t *testing.T, e *testenv.Env, id string) runRecord {
	t.Helper()
	st, body, _ := e.Do(t, "GET", "/interns/"+e.InternID+"/runs/"+id, e.WorkspaceKey, "", "")
	var r runRecord
	if err := json.Unmarshal([]byte(body), &r); err != nil || st != 200 {
		t.Fatalf("get run: %d %s", st, body)
	}
	return r
}

// TestRunsPageAnswersPause (1280×900), end to end with the real daemon and
// the demo intern: a background run started from the Runs page in manual
// mode appears in the session's list and pauses on "$ echo …"; the page
// shows the question with the command; the event stream, broken by the
// gateway closing every connection, resumes after the last event it
// showed; "Allow once" from the page continues the run, whose events show
// live (each once) until it completes, and the list says completed. A
// question then becomes a form whose text answer the run goes on with.
func TestRunsPageAnswersPause(t *testing.T) {
	t.Parallel()
	e := demoEnv(t)
	b := browsertest.New(t, 1280, 900)
	signIn(t, b, e.HTTP.URL+"/", e.WorkspaceKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/runs/"+e.InternID),
		chromedp.WaitReady(css("#runs-intern option[value='"+e.InternID+"']")),
		chromedp.WaitVisible(css("#run-prompt")),
		chromedp.SendKeys(css("#run-prompt"), "$ echo from the background"),
		chromedp.Click(css("#run-start")),
		chromedp.WaitVisible(css("#run-question button[data-kind=allow_once]")),
	)
	id := browsertest.Get(t, b, chromedp.Evaluate[string](`document.querySelector(".run-detail").dataset.run`))
	run := getRunREST(t, e, id)
	if run.Status != "paused" {
		t.Fatalf("the run the page shows paused is %s in the API", run.Status)
	}
	// The session's list shows it, and the URL names the session and run.
	if s := browsertest.Get(t, b, chromedp.Value(css("#runs-session"))); s != run.SessionID {
		t.Fatalf("session field %q, run's session %q", s, run.SessionID)
	}
	until(t, b, runRow(id)+`?.dataset.status === "paused"`)
	if u := browsertest.Get(t, b, chromedp.Location()); !strings.HasSuffix(u, "#/runs/"+e.InternID+"/"+run.SessionID+"/"+id) {
		t.Fatalf("URL %s", u)
	}
	if in := b.Text(t, "#run-question pre.pause-input"); in != "echo from the background" {
		t.Fatalf("the question shows %q as the command", in)
	}
	kinds := browsertest.Get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#run-question button")].map(b => b.dataset.kind)`))
	if strings.Join(kinds, ",") != "allow_once,allow_always,reject_once,reject_always,cancel" {
		t.Fatalf("question buttons %v", kinds)
	}
	until(t, b, `document.querySelector(".run-detail").dataset.lastSeq === "`+strconv.FormatInt(run.LastEventID, 10)+`"`)
	screenshot(t, b, "console-runs.png")

	// Every connection cut: the page resumes its event stream after the
	// last event it showed. Chromium logs the cut requests, and only them.
	b.NoErrors(t)
	e.HTTP.CloseClientConnections()
	until(t, b, `Number(document.querySelector(".run-detail").dataset.resumes ?? 0) >= 1 && document.getElementById("run-status").textContent.startsWith("Following")`)

	click(t, b, "#run-question button[data-kind=allow_once]")
	until(t, b, `document.querySelector(".run-detail").dataset.followed === "ended"`)
	until(t, b, `document.querySelector(".run-detail").dataset.status === "completed" && `+runRow(id)+`?.dataset.status === "completed"`)
	run = getRunREST(t, e, id)
	if run.Status != "completed" {
		t.Fatalf("the API has the run %s", run.Status)
	}
	if seq := browsertest.Get(t, b, chromedp.Evaluate[string](`document.querySelector(".run-detail").dataset.lastSeq`)); seq != strconv.FormatInt(run.LastEventID, 10) {
		t.Fatalf("the page showed events to %s, the run has %d", seq, run.LastEventID)
	}
	turn := b.Text(t, ".run-detail .turn")
	if !contains(turn, "Answered: Allow once", "Shell result:", "from the background", "Finish\nstop", "tokens") {
		t.Fatalf("transcript after allow once:\n%s", turn)
	}
	// Each event once, across the broken stream and the pause.
	for _, s := range []string{"Answered: Allow once", "so the rest is a shell command", "Shell result:"} {
		if n := strings.Count(turn, s); n != 1 {
			t.Fatalf("%q %d times in the transcript:\n%s", s, n, turn)
		}
	}
	if n := browsertest.Get(t, b, chromedp.Evaluate[int](`document.querySelectorAll("#run-question, .run-detail .pause").length`)); n != 0 {
		t.Fatalf("%d question blocks left after the answer", n)
	}
	if n := browsertest.Get(t, b, chromedp.Evaluate[int](`document.querySelectorAll("#runs-list button[aria-label^='Cancel ']").length`)); n != 0 {
		t.Fatal("a completed run still offers Cancel")
	}

	// A question in the same session: a second run, listed after the
	// first, whose text answer from the page the agent uses.
	b.Do(t,
		chromedp.SendKeys(css("#run-prompt"), "is it done?"),
		chromedp.Click(css("#run-start")),
		chromedp.WaitVisible(css("#run-question input[name=answer]")),
	)
	second := browsertest.Get(t, b, chromedp.Evaluate[string](`document.querySelector(".run-detail").dataset.run`))
	if second == id {
		t.Fatal("the page still shows the first run")
	}
	until(t, b, `[...document.querySelectorAll("#runs-list tr[data-run]")].map(r => r.dataset.run + ":" + r.dataset.status).join(",") === "`+id+`:completed,`+second+`:paused"`)
	b.Do(t,
		chromedp.SendKeys(css("#run-question input[name=answer]"), "yes"),
		chromedp.Click(css("#run-question button[data-action=accept]")),
	)
	until(t, b, `document.querySelector(".run-detail").dataset.followed === "ended" && `+runRow(second)+`?.dataset.status === "completed"`)
	if c := b.Text(t, ".run-detail .turn"); !contains(c, "Answered: Accepted", "You answered: yes", run.SessionID) {
		t.Fatalf("question run:\n%s", c)
	}
	for _, err := range b.Errors() {
		if !strings.HasPrefix(err, "log network: Failed to load resource: net::ERR_") || !strings.Contains(err, e.URL+"/cohort.v1.RunService/") {
			t.Errorf("the browser reported: %s", err)
		}
	}
}

// TestRunsPageCancels (390×844): a background run started through the API
// ("$ sleep 60", self-drive) shows running in its session's list, opened
// by URL; Cancel (pressed twice) stops it, the list shows it cancelled
// without a Cancel button, and its events end with the cancellation.
func TestRunsPageCancels(t *testing.T) {
	t.Parallel()
	e := demoEnv(t)
	st, body, _ := e.Do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey, "application/json",
		`{"stream": true, "background": true, "approval_mode": "self-drive", "messages": [{"role": "user", "content": "$ sleep 60"}]}`)
	var run runRecord
	if err := json.Unmarshal([]byte(body), &run); err != nil || st != 202 {
		t.Fatalf("start: %d %s", st, body)
	}
	b := browsertest.New(t, 390, 844)
	signIn(t, b, e.HTTP.URL+"/", e.WorkspaceKey)
	row := runRow(run.ID)
	b.Do(t, chromedp.Navigate(e.HTTP.URL+"/#/runs/"+e.InternID+"/"+run.SessionID))
	until(t, b, row+`?.dataset.status === "running"`)
	fitsPhone(t, b, "runs page")
	click(t, b, `button[aria-label="Cancel `+run.ID+`"]`)
	click(t, b, `button[aria-label="Confirm cancel: Cancel `+run.ID+`"]`)
	until(t, b, row+`?.dataset.status === "cancelled"`)
	if r := getRunREST(t, e, run.ID); r.Status != "cancelled" {
		t.Fatalf("the API has the run %s", r.Status)
	}
	if n := browsertest.Get(t, b, chromedp.Evaluate[int](`document.querySelectorAll("#runs-list button[aria-label^='Cancel ']").length`)); n != 0 {
		t.Fatal("a cancelled run still offers Cancel")
	}
	if msg := b.Text(t, "main .ok"); !strings.Contains(msg, run.ID) {
		t.Fatalf("cancel message %q", msg)
	}
	click(t, b, `button[aria-label="Events of `+run.ID+`"]`)
	until(t, b, `document.querySelector(".run-detail")?.dataset.followed === "ended"`)
	if rec := b.Text(t, ".run-detail .run-record"); !contains(rec, "cancelled", "run_ended") {
		t.Fatalf("run record:\n%s", rec)
	}
	fitsPhone(t, b, "a cancelled run's events")
	b.NoErrors(t)
}
