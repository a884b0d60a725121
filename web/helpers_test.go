package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"github.com/uptrace/bun"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/browsertest"
)

func css(s string) chromedp.CSS { return chromedp.CSS(s) }

// signIn opens the console at base and signs in with key.
func signIn(t *testing.T, b *browsertest.Browser, base, key string) {
	t.Helper()
	b.Do(t,
		chromedp.Navigate(base),
		chromedp.WaitVisible(css("#key")),
		chromedp.SetValue(css("#key"), key),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css("nav a[href='#/workspaces']")),
	)
}

// until waits (10 s at most) for a JavaScript expression to be true.
func until(t *testing.T, b *browsertest.Browser, expr string) {
	t.Helper()
	browsertest.Get(t, b, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(10*time.Second)))
}

// click clicks the element css selects as the page is at that moment
// (waiting 10 s at most for it). A chromedp.Click resolves the node first
// and fails if a re-render replaces it in between.
func click(t *testing.T, b *browsertest.Browser, sel string) {
	t.Helper()
	q, _ := json.Marshal(sel)
	until(t, b, `(() => { const el = document.querySelector(`+string(q)+`); if (!el) return false; el.click(); return true; })()`)
}

// screenshot saves the page as docs/<name> when COHORT_SCREENSHOTS=1 (the
// README shows them); otherwise it does nothing.
func screenshot(t *testing.T, b *browsertest.Browser, name string) {
	t.Helper()
	if os.Getenv("COHORT_SCREENSHOTS") != "1" {
		return
	}
	png := browsertest.Get(t, b, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join("..", "docs", name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// script plays one daemon call: it sends events and returns the call's
// result.
type script func(ctx context.Context, send func(*interndv1.RunEvent) error) error

// daemon is a scripted InternDaemonService over h2c, standing in for the
// intern's process the way internal/chat's tests do: the console's stream
// goes through the real gateway, a real Connect client and real HTTP/2.
type daemon struct {
	mu      sync.Mutex
	start   script
	answer  script
	starts  []*interndv1.StartTurnRequest
	answers []*interndv1.AnswerRequest
	// ended receives each call's context error when it returns.
	ended  chan error
	client interndv1connect.InternDaemonServiceClient
}

func newDaemon(t *testing.T) *daemon {
	d := &daemon{ended: make(chan error, 16)}
	mux := http.NewServeMux()
	mux.Handle(interndv1connect.NewInternDaemonServiceHandler(d))
	srv := httptest.NewUnstartedServer(mux)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)
	var cp http.Protocols
	cp.SetUnencryptedHTTP2(true)
	d.client = interndv1connect.NewInternDaemonServiceClient(&http.Client{Transport: &http.Transport{Protocols: &cp}}, srv.URL)
	return d
}

// ClientFor and Wake implement turn.Daemons; Wake wakes nobody.
func (d *daemon) ClientFor(*store.Intern) (interndv1connect.InternDaemonServiceClient, error) {
	return d.client, nil
}

func (d *daemon) Wake(_ context.Context, in *store.Intern) (*store.Intern, error) { return in, nil }

func (d *daemon) set(start, answer script) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.start, d.answer = start, answer
}

func (d *daemon) calls() ([]*interndv1.StartTurnRequest, []*interndv1.AnswerRequest) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*interndv1.StartTurnRequest(nil), d.starts...), append([]*interndv1.AnswerRequest(nil), d.answers...)
}

func (d *daemon) StartTurn(ctx context.Context, req *connect.Request[interndv1.StartTurnRequest], out *connect.ServerStream[interndv1.StartTurnResponse]) error {
	d.mu.Lock()
	d.starts = append(d.starts, req.Msg)
	sc := d.start
	d.mu.Unlock()
	defer func() { d.ended <- ctx.Err() }()
	return sc(ctx, func(ev *interndv1.RunEvent) error { return out.Send(&interndv1.StartTurnResponse{Event: ev}) })
}

func (d *daemon) Answer(ctx context.Context, req *connect.Request[interndv1.AnswerRequest], out *connect.ServerStream[interndv1.AnswerResponse]) error {
	d.mu.Lock()
	d.answers = append(d.answers, req.Msg)
	sc := d.answer
	d.mu.Unlock()
	defer func() { d.ended <- ctx.Err() }()
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

// events returns a script that sends evs and ends the call normally.
func events(evs ...*interndv1.RunEvent) script {
	return func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return err
			}
		}
		return nil
	}
}

func ev(model string, e any) *interndv1.RunEvent {
	r := &interndv1.RunEvent{Model: model}
	switch e := e.(type) {
	case *interndv1.Started:
		r.Event = &interndv1.RunEvent_Started{Started: e}
	case *interndv1.TextDelta:
		r.Event = &interndv1.RunEvent_Text{Text: e}
	case *interndv1.ReasoningDelta:
		r.Event = &interndv1.RunEvent_Reasoning{Reasoning: e}
	case *interndv1.Interaction:
		r.Event = &interndv1.RunEvent_Interaction{Interaction: e}
	case *interndv1.Usage:
		r.Event = &interndv1.RunEvent_Usage{Usage: e}
	case *interndv1.Finished:
		r.Event = &interndv1.RunEvent_Finished{Finished: e}
	}
	return r
}

// setState puts the bootstrap intern in state (the scripted daemon has no
// provisioner to do it).
func setState(t *testing.T, db *bun.DB, id, state string) {
	t.Helper()
	if _, err := db.NewUpdate().Model((*store.Intern)(nil)).Set("state = ?", state).Where("id = ?", id).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// refusal is a daemon error as the daemon sends it: a Connect error with
// the spec's reason in a cohort.v1.ErrorDetail.
func refusal(status int, reason apierr.Reason, msg string) error {
	return apierr.ToConnect(apierr.New(status, reason, "%s", msg))
}

func ptr[T any](v T) *T { return &v }

func contains(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// fieldID is the id of the control named name.
func fieldID(t *testing.T, b *browsertest.Browser, name string) string {
	t.Helper()
	return browsertest.Get(t, b, chromedp.Evaluate[string](`document.querySelector("[name=`+name+`]").id`))
}

// clear empties a control as a user would, so its input handlers run
// (chromedp.SetValue refuses an empty value).
func clear(t *testing.T, b *browsertest.Browser, sel string) {
	t.Helper()
	browsertest.Get(t, b, chromedp.Evaluate[bool](`(() => { const el = document.querySelector(`+"`"+sel+"`"+`); el.value = ""; el.dispatchEvent(new Event("input")); return true })()`))
}

// fitsPhone fails t when the page scrolls sideways at the 390 px viewport.
func fitsPhone(t *testing.T, b *browsertest.Browser, where string) {
	t.Helper()
	if w := browsertest.Get(t, b, chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); w > 390 {
		t.Errorf("%s: the page is %d px wide at 390", where, w)
	}
}
