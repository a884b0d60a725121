package web_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/webhooks"
)

// TestWebhooksPage: an endpoint created in the console shows its secret
// once (and the database holds it only wrapped); after a reload the page
// has no secret; a delivery appears in the endpoint's log; delete asks for
// a second press.
func TestWebhooksPage(t *testing.T) {
	t.Parallel()
	cfg := testenv.Config()
	cfg.Webhooks.AllowHosts = []string{"127.0.0.0/8"}
	e := testenv.NewConfig(t, storetest.SQLite(t), cfg)
	b := browsertest.New(t, 1280, 900)
	signIn(t, b, e.HTTP.URL+"/", e.WorkspaceKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/webhooks"),
		chromedp.WaitReady(css("#hooks-ws option")),
		chromedp.SendKeys(css("input[name=url]"), "http://127.0.0.1:9/hook"),
		chromedp.SendKeys(css("input[name=description]"), "ci bot"),
		chromedp.Click(css("form button[type=submit]")),
	)
	until(t, b, `document.querySelector("#new-secret")?.value.startsWith("whsec_")`)
	secret := browsertest.Get(t, b, chromedp.Evaluate[string](`document.querySelector("#new-secret").value`))
	until(t, b, `document.querySelector("table")?.textContent.includes("http://127.0.0.1:9/hook")`)
	var wrapped []byte
	e.DB.NewRaw("SELECT secret FROM webhook_endpoints").Scan(context.Background(), &wrapped)
	if len(wrapped) == 0 || strings.Contains(string(wrapped), strings.TrimPrefix(secret, "whsec_")) {
		t.Fatal("the secret is not stored wrapped")
	}

	if err := e.DB.RunInTx(context.Background(), nil, func(ctx context.Context, tx bun.Tx) error {
		return webhooks.RunChanged(ctx, tx, e.WorkspaceID, webhooks.RunCompleted, json.RawMessage(`{"id":"run_console"}`))
	}); err != nil {
		t.Fatal(err)
	}
	b.Do(t, chromedp.Reload(), chromedp.WaitReady(css("#hooks-ws option")))
	until(t, b, `document.querySelector("table")?.textContent.includes("ci bot")`)
	if html := browsertest.Get(t, b, chromedp.Evaluate[string](`document.body.innerHTML`)); strings.Contains(html, "whsec_") {
		t.Fatal("the secret is on the page after a reload")
	}
	// A laptop's short window: the log is below the endpoints and the form.
	b.Do(t, chromedp.EmulateViewport(1280, 500))
	click(t, b, `button[aria-label="Deliveries of http://127.0.0.1:9/hook"]`)
	until(t, b, `[...document.querySelectorAll("table")].some(t => t.textContent.includes("run.completed") && t.textContent.includes("pending"))`)
	// It opens in view, or the button seems to do nothing.
	until(t, b, `(() => { const h = [...document.querySelectorAll("h2")].find(h => h.textContent.startsWith("Deliveries to"));
		const r = h?.getBoundingClientRect(); return !!r && r.top >= 0 && r.bottom <= innerHeight; })()`)

	click(t, b, `button[aria-label="Delete http://127.0.0.1:9/hook"]`)
	click(t, b, `button[aria-label="Confirm delete: Delete http://127.0.0.1:9/hook"]`)
	until(t, b, `document.body.textContent.includes("No endpoints in this workspace.")`)
}
