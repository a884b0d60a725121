package web_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// chatEnv is a gateway whose bootstrap intern runs on a scripted daemon,
// and a phone-sized browser signed in with the workspace key on the
// playground of that intern.
func chatEnv(t *testing.T, d *daemon) (*testenv.Env, *browsertest.Browser) {
	t.Helper()
	e := testenv.New(t, storetest.SQLite(t), func(s *server.Server) { s.Chat.Daemons = d })
	setState(t, e.DB, e.InternID, store.InternRunning)
	b := browsertest.New(t, 390, 844)
	signIn(t, b, e.HTTP.URL+"/", e.WorkspaceKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/chat/"+e.InternID),
		chromedp.WaitVisible(css("#prompt")),
		chromedp.WaitReady(css("#chat-intern option[value='"+e.InternID+"']")),
	)
	return e, b
}

// TestChatPauseForwarding (scripted daemon, so every detail is fixed): a
// manual-mode prompt streams reasoning apart from content, pauses on a
// permission shown as one button per offered kind (and cancel), the answer
// from a button reaches the daemon as that interaction's answer in that
// session, and the same run streams on to its end with the session id, each
// model the chunks named and the usage with cached tokens and cost.
func TestChatPauseForwarding(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	const model = "cohort/demo"
	d.set(
		events(
			ev(model, &interndv1.Started{SessionId: "sess-42", RunId: "run-1"}),
			ev(model, &interndv1.ReasoningDelta{Text: "The user wants a shell command."}),
			ev(model, &interndv1.TextDelta{Text: "I will run echo hi."}),
			ev(model, &interndv1.Interaction{Id: "int-1", Kind: &interndv1.Interaction_Permission{Permission: &interndv1.Permission{
				Operation: ptr("shell"), Options: []string{"allow_once", "reject_once"}}}}),
			ev(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED}),
		),
		events(
			ev(model, &interndv1.Started{SessionId: "sess-42", RunId: "run-1", Continuation: true}),
			ev("cohort/demo-2", &interndv1.TextDelta{Text: "hi"}),
			ev("cohort/demo-2", &interndv1.Usage{PromptTokens: 40, CompletionTokens: 9, TotalTokens: 49, Cost: ptr(0.00042), CachedTokens: ptr[int64](16)}),
			ev("cohort/demo-2", &interndv1.Finished{Reason: interndv1.Finished_REASON_STOP}),
		),
	)
	_, b := chatEnv(t, d)
	b.Do(t,
		chromedp.Click(css("#mode-manual")),
		chromedp.SendKeys(css("#prompt"), "$ echo hi"),
		chromedp.Click(css("#send")),
		chromedp.WaitVisible(css(".pause.permission button[data-kind=allow_once]")),
	)
	kinds := browsertest.Get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll(".pause button")].map(b => b.dataset.kind)`))
	if strings.Join(kinds, ",") != "allow_once,reject_once,cancel" {
		t.Fatalf("pause buttons %v, want the offered kinds and cancel", kinds)
	}
	reasoning := b.Text(t, ".turn .reasoning")
	content := b.Text(t, ".turn .content")
	if !strings.Contains(reasoning, "The user wants a shell command.") || strings.Contains(content, "shell command") || content != "I will run echo hi." {
		t.Fatalf("reasoning %q, content %q", reasoning, content)
	}
	if s := browsertest.Get(t, b, chromedp.Value(css("#session"))); s != "sess-42" {
		t.Fatalf("session field %q after the pause", s)
	}
	if focused := browsertest.Get(t, b, chromedp.Evaluate[string](`document.activeElement.dataset.kind || ""`)); focused != "allow_once" {
		t.Fatalf("focus on %q after the pause, want the first option", focused)
	}
	b.Do(t,
		chromedp.Click(css(".pause button[data-kind=allow_once]")),
		chromedp.WaitVisible(css(".turn .answered")),
	)
	until(t, b, `document.getElementById("chat-status").textContent === "Finished."`)
	turn := b.Text(t, ".turn")
	if !contains(turn, "Answered: Allow once", "hi", "sess-42", "40 prompt + 9 completion = 49 tokens (16 cached)", "cost $0.000420") {
		t.Fatalf("turn after the answer:\n%s", turn)
	}
	if models := b.Text(t, ".turn .models"); models != "cohort/demo → cohort/demo-2" {
		t.Fatalf("models %q", models)
	}
	starts, answers := d.calls()
	if len(starts) != 1 || starts[0].GetPrompt() != "$ echo hi" || starts[0].GetApprovalMode() != interndv1.ApprovalMode_APPROVAL_MODE_MANUAL || starts[0].GetSessionId() != "" {
		t.Fatalf("start turn calls %v", starts)
	}
	if len(answers) != 1 || answers[0].GetSessionId() != "sess-42" || answers[0].GetInteractionId() != "int-1" || answers[0].GetAnswer() != "allow_once" {
		t.Fatalf("answer calls %v", answers)
	}
	// The next prompt continues the session, in the mode chosen for it.
	d.set(events(
		ev(model, &interndv1.Started{SessionId: "sess-42", RunId: "run-2"}),
		ev(model, &interndv1.TextDelta{Text: "done"}),
		ev(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_STOP}),
	), nil)
	b.Do(t,
		chromedp.Click(css("#mode-self-drive")),
		chromedp.SendKeys(css("#prompt"), "again"),
		chromedp.Click(css("#send")),
	)
	until(t, b, `document.querySelectorAll(".turn").length === 2 && document.getElementById("chat-status").textContent === "Finished."`)
	if u := b.Text(t, ".turn:nth-child(2) .usage"); u != "not reported" {
		t.Fatalf("usage without a report: %q", u)
	}
	starts, _ = d.calls()
	if len(starts) != 2 || starts[1].GetSessionId() != "sess-42" || starts[1].GetApprovalMode() != interndv1.ApprovalMode_APPROVAL_MODE_SELF_DRIVE {
		t.Fatalf("second start %v", starts[len(starts)-1])
	}
	b.NoErrors(t)
}

// TestChatQuestionPause: a question becomes a form from its field
// descriptors (required marks, options as a select); the accepted answer is
// the JSON object the spec defines. A refused answer (400) keeps the form
// usable, with the API's message.
func TestChatQuestionPause(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	const model = "cohort/demo"
	question := &interndv1.Interaction{Id: "int-7", Kind: &interndv1.Interaction_Question{Question: &interndv1.Question{
		Message: "Which colour?",
		Fields: []*interndv1.Field{
			{Name: "colour", Type: "string", Required: true, Options: []string{"red", "blue"}},
			{Name: "count", Type: "integer"},
			{Name: "note", Type: "string"},
		}}}}
	d.set(events(
		ev(model, &interndv1.Started{SessionId: "s-q", RunId: "r"}),
		ev(model, question),
		ev(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED}),
	), nil)
	_, b := chatEnv(t, d)
	b.Do(t,
		chromedp.SendKeys(css("#prompt"), "colour?"),
		chromedp.Click(css("#send")),
		chromedp.WaitVisible(css(".pause.question select[name=colour]")),
	)
	opts := browsertest.Get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll(".pause select[name=colour] option")].map(o => o.value)`))
	marks := browsertest.Get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll(".pause .field")].map(f => f.querySelector("label").textContent + (f.querySelector("[required]") ? "!" : ""))`))
	if strings.Join(opts, ",") != ",red,blue" || strings.Join(marks, "|") != "colour *!|count|note" {
		t.Fatalf("question form: options %v, labels %v", opts, marks)
	}
	if typ := browsertest.Get(t, b, chromedp.Evaluate[string](`document.querySelector(".pause input[name=count]").type`)); typ != "number" {
		t.Fatalf("integer field is a %q input", typ)
	}
	// Accept without the required field: the form says so and sends nothing.
	b.Do(t, chromedp.Click(css(".pause button[data-action=accept]")))
	if msg := b.Text(t, ".pause .field-error"); msg != "colour is required" {
		t.Fatalf("required message %q", msg)
	}
	// The daemon refuses the first answer (400), accepts the second.
	d.set(nil, func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		_, answers := d.calls()
		if len(answers) == 1 {
			return refusal(400, "bad_request", "answer is not acceptable: count must be positive")
		}
		return events(
			ev(model, &interndv1.Started{SessionId: "s-q", RunId: "r", Continuation: true}),
			ev(model, &interndv1.TextDelta{Text: "Blue it is."}),
			ev(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_STOP}),
		)(ctx, send)
	})
	b.Do(t,
		chromedp.SetValue(css(".pause select[name=colour]"), "blue"),
		chromedp.SendKeys(css(".pause input[name=count]"), "3"),
		chromedp.Click(css(".pause button[data-action=accept]")),
		chromedp.WaitVisible(css(".pause .error")),
	)
	if msg := b.Text(t, ".pause .error"); msg != "answer is not acceptable: count must be positive" {
		t.Fatalf("refused answer shown as %q", msg)
	}
	b.Do(t, chromedp.Click(css(".pause button[data-action=accept]")))
	until(t, b, `document.getElementById("chat-status").textContent === "Finished."`)
	if c := b.Text(t, ".turn .content"); c != "Blue it is." {
		t.Fatalf("content after the answer %q", c)
	}
	_, answers := d.calls()
	if len(answers) != 2 {
		t.Fatalf("%d answers", len(answers))
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(answers[1].GetAnswer()), &got); err != nil {
		t.Fatal(err)
	}
	want := `{"action":"accept","content":{"colour":"blue","count":3}}`
	if g, _ := json.Marshal(got); string(g) != want || answers[1].GetInteractionId() != "int-7" || answers[1].GetSessionId() != "s-q" {
		t.Fatalf("answer %s (%s, %s), want %s", g, answers[1].GetInteractionId(), answers[1].GetSessionId(), want)
	}
	b.NoErrors(t)
}

// TestChatStop: the stop button aborts the stream; the gateway sees the
// caller go and cancels the daemon call (the run).
func TestChatStop(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	d.set(func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(ev("m", &interndv1.Started{SessionId: "s", RunId: "r"}))
		send(ev("m", &interndv1.TextDelta{Text: "thinking forever"}))
		<-ctx.Done()
		return ctx.Err()
	}, nil)
	_, b := chatEnv(t, d)
	b.Do(t,
		chromedp.SendKeys(css("#prompt"), "loop"),
		chromedp.Click(css("#send")),
		chromedp.WaitVisible(css(".turn .content")),
	)
	if dis := browsertest.Get(t, b, chromedp.Evaluate[bool](`document.getElementById("send").disabled && !document.getElementById("stop").disabled`)); !dis {
		t.Fatal("while streaming, send should be disabled and stop enabled")
	}
	b.Do(t, chromedp.Click(css("#stop")))
	until(t, b, `document.getElementById("chat-status").textContent === "Stopped."`)
	if id := browsertest.Get(t, b, chromedp.Evaluate[string](`document.activeElement.id`)); id != "prompt" {
		t.Fatalf("focus on %q after stop, want the prompt", id)
	}
	select {
	case err := <-d.ended:
		if err == nil {
			t.Fatal("the daemon call ended without being cancelled")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon call was not cancelled after stop")
	}
	b.NoErrors(t)
}

// TestChatRefusal: a refusal before the stream opens is shown as the API
// words it (here the intern is not running).
func TestChatRefusal(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	e, b := chatEnv(t, d)
	setState(t, e.DB, e.InternID, store.InternSuspended)
	b.Do(t,
		chromedp.SendKeys(css("#prompt"), "hi"),
		chromedp.Click(css("#send")),
		chromedp.WaitVisible(css(".turn .error")),
	)
	if msg := b.Text(t, ".turn .error"); msg != "intern is suspended, not running" {
		t.Fatalf("refusal shown as %q", msg)
	}
	if s, _ := d.calls(); len(s) != 0 {
		t.Fatalf("the daemon was called: %v", s)
	}
	b.NoErrors(t)
}

// TestChatPermissionCancel: Cancel on a permission pause sends "cancel";
// the run's end arrives as an error chunk, shown with its code and reason.
// An answer the daemon no longer waits for (409) closes the pause.
func TestChatPermissionCancel(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	pause := events(
		ev("m", &interndv1.Started{SessionId: "s-c", RunId: "r"}),
		ev("m", &interndv1.Interaction{Id: "int-c", Kind: &interndv1.Interaction_Permission{Permission: &interndv1.Permission{Options: []string{"allow_once", "reject_once"}}}}),
		ev("m", &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED}),
	)
	d.set(pause, events(
		ev("m", &interndv1.Started{SessionId: "s-c", RunId: "r", Continuation: true}),
		ev("", &interndv1.Finished{Reason: interndv1.Finished_REASON_ENDED, Code: 410, ErrorReason: "run_ended", Message: "the caller cancelled the run"}),
	))
	_, b := chatEnv(t, d)
	b.Do(t,
		chromedp.SendKeys(css("#prompt"), "$ rm -rf /"),
		chromedp.Click(css("#send")),
		chromedp.WaitVisible(css(".pause button[data-kind=cancel]")),
	)
	if op := b.Text(t, ".pause p"); op != "The intern asks to use a tool." {
		t.Fatalf("a permission without an operation reads %q", op)
	}
	b.Do(t, chromedp.Click(css(".pause button[data-kind=cancel]")))
	until(t, b, `document.getElementById("chat-status").textContent === "Failed."`)
	if msg := b.Text(t, ".turn .error[role=alert]"); msg != "the caller cancelled the run (410 run_ended)" {
		t.Fatalf("error chunk shown as %q", msg)
	}
	if _, answers := d.calls(); len(answers) != 1 || answers[0].GetAnswer() != "cancel" || answers[0].GetInteractionId() != "int-c" {
		t.Fatalf("answers %v", answers)
	}
	// A second pause whose answer comes too late: the pause shows the
	// API's words and offers nothing more.
	d.set(pause, func(context.Context, func(*interndv1.RunEvent) error) error {
		return refusal(409, "interaction_not_pending", "the question is no longer waiting")
	})
	b.Do(t,
		chromedp.SendKeys(css("#prompt"), "$ ls"),
		chromedp.Click(css("#send")),
		chromedp.WaitVisible(css(".turn:nth-child(2) .pause button[data-kind=allow_once]")),
		chromedp.Click(css(".turn:nth-child(2) .pause button[data-kind=allow_once]")),
		chromedp.WaitVisible(css(".turn:nth-child(2) .pause .error")),
	)
	if msg := b.Text(t, ".turn:nth-child(2) .pause .error"); msg != "the question is no longer waiting" {
		t.Fatalf("late answer shown as %q", msg)
	}
	if open := browsertest.Get(t, b, chromedp.Evaluate[int](`[...document.querySelectorAll(".turn:nth-child(2) .pause button")].filter(b => !b.disabled).length`)); open != 0 {
		t.Fatalf("%d pause buttons still enabled after interaction_not_pending", open)
	}
	if role := browsertest.Get(t, b, chromedp.Evaluate[string](`document.querySelector(".transcript").getAttribute("role")`)); role != "log" {
		t.Fatalf("transcript role %q", role)
	}
	b.NoErrors(t)
}
