package web_test

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/cohort-dev/cohort/internal/browsertest"
	"github.com/cohort-dev/cohort/internal/storetest"
	"github.com/cohort-dev/cohort/internal/testenv"
)

// TestSignInAndCreateWorkspace drives the console in a real Chromium at a
// phone's width: a wrong key is refused as the API words it, the right key
// signs in (kept in sessionStorage only), and a workspace is created and
// listed.
func TestSignInAndCreateWorkspace(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	b := browsertest.New(t, 390, 844)
	base := e.HTTP.URL + "/"
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	b.Do(t,
		chromedp.Navigate(base),
		chromedp.WaitVisible(css("#key")),
		chromedp.SendKeys(css("#key"), "cohort_mk_wrong"),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css(".error")),
	)
	if alert := b.Text(t, ".error"); !strings.Contains(alert, "invalid API key") {
		t.Fatalf("wrong key: alert %q", alert)
	}
	b.Do(t,
		chromedp.SetValue(css("#key"), e.ManagementKey),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css("input[name=name]")),
		chromedp.SendKeys(css("input[name=name]"), "Browser Team"),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css(".ok")),
	)
	listed := b.Text(t, "table")
	local := browsertest.Get(t, b, chromedp.Evaluate[string](`JSON.stringify(localStorage)`))
	session := browsertest.Get(t, b, chromedp.Evaluate[string](`sessionStorage.getItem("cohort.apiKey")`))
	url := browsertest.Get(t, b, chromedp.Location())
	if !strings.Contains(listed, "browser-team") {
		t.Fatalf("created workspace not listed: %q", listed)
	}
	if session != e.ManagementKey || strings.Contains(local, "cohort_") || strings.Contains(url, "cohort_") {
		t.Fatalf("key storage: session %t, local %q, url %q", session == e.ManagementKey, local, url)
	}
	// A bad slug is shown as the API words it (the browser's own pattern
	// check is lifted so the server's answer is what we see).
	b.Do(t,
		chromedp.SendKeys(css("input[name=name]"), "x"),
		chromedp.SetAttributeValue(css("input[name=slug]"), "pattern", ".*"),
		chromedp.SendKeys(css("input[name=slug]"), "Bad--Slug"),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css(".error")),
	)
	if bad := b.Text(t, ".error"); !strings.Contains(bad, "slug must be lowercase") {
		t.Fatalf("bad slug message %q", bad)
	}
	n, _ := e.DB.NewSelect().Table("workspaces").Count(context.Background())
	if n != 2 {
		t.Fatalf("%d workspaces, want 2", n)
	}
	b.NoErrors(t)
}
