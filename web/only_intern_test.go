package web_test

import (
	"testing"

	"github.com/chromedp/chromedp"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestOnlyInternPreselected (1280×800): with a single intern, the
// playground and the vault page opened without an intern in the address
// preselect it, so a turn is sent without choosing one.
func TestOnlyInternPreselected(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	d.set(events(
		ev("cohort/demo", &interndv1.Started{SessionId: "s-1", RunId: "r-1"}),
		ev("cohort/demo", &interndv1.TextDelta{Text: "hello"}),
		ev("cohort/demo", &interndv1.Finished{Reason: interndv1.Finished_REASON_STOP}),
	), nil)
	e := testenv.New(t, storetest.SQLite(t), func(s *server.Server) { s.Chat.Daemons = d })
	setState(t, e.DB, e.InternID, store.InternRunning)
	b := browsertest.New(t, 1280, 800)
	signIn(t, b, e.HTTP.URL+"/", e.WorkspaceKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/chat"),
		chromedp.WaitVisible(css("#prompt")),
		chromedp.WaitReady(css("#chat-intern option[value='"+e.InternID+"']")),
	)
	if v := browsertest.Get(t, b, chromedp.Value(css("#chat-intern"))); v != e.InternID {
		t.Fatalf("playground intern %q, want the only intern %s", v, e.InternID)
	}
	b.Do(t,
		chromedp.SendKeys(css("#prompt"), "hi"),
		chromedp.Click(css("#send")),
	)
	until(t, b, `document.getElementById("chat-status").textContent === "Finished."`)
	if starts, _ := d.calls(); len(starts) != 1 || starts[0].GetPrompt() != "hi" {
		t.Fatalf("start turn calls %v", starts)
	}
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/vault"),
		chromedp.WaitReady(css("#vault-intern option[value='"+e.InternID+"']")),
	)
	if v := browsertest.Get(t, b, chromedp.Value(css("#vault-intern"))); v != e.InternID {
		t.Fatalf("vault intern %q, want the only intern %s", v, e.InternID)
	}
	b.NoErrors(t)
}
