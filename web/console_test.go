package web_test

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
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
	// The list reloads after the confirmation shows.
	until(t, b, `!!document.querySelector("table") && document.querySelector("table").innerText.includes("browser-team")`)
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

// TestWorkspaceEveryField creates a workspace with every field of the
// spec's create request set from the form; the client-side checks mirror
// the service's bounds and send nothing.
func TestWorkspaceEveryField(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	b := browsertest.New(t, 390, 844)
	signIn(t, b, e.HTTP.URL+"/", e.ManagementKey)
	var wk store.APIKey
	if err := e.DB.NewSelect().Model(&wk).Where("kind = ?", store.KeyWorkspace).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	count := func() int64 {
		n, err := e.DB.NewSelect().Table("workspaces").Count(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Past the bounds: nothing is sent.
	b.Do(t,
		chromedp.WaitVisible(css("input[name=name]")),
		chromedp.SetValue(css("input[name=name]"), strings.Repeat("😀", 101)),
		chromedp.SetValue(css("input[name=io_logging_sampling_rate]"), "0.00009"),
		chromedp.Click(css("form button[type=submit]")),
	)
	if msg := b.Text(t, "#"+fieldID(t, b, "name")+"-err"); msg != "name must be at most 100 characters (got 101)" {
		t.Fatalf("name past the bound: %q", msg)
	}
	if msg := b.Text(t, "#"+fieldID(t, b, "io_logging_sampling_rate")+"-err"); msg != "io_logging_sampling_rate must be between 0.0001 and 1" {
		t.Fatalf("rate past the bound: %q", msg)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d workspaces after a refused form", n)
	}
	// At the bounds, every field set.
	name := strings.Repeat("😀", 99) + "x" // 100 characters, 199 UTF-16 units
	b.Do(t,
		chromedp.SetValue(css("input[name=name]"), name),
		chromedp.SetValue(css("input[name=slug]"), "data-team"),
		chromedp.SetValue(css("textarea[name=description]"), "Line one\nline two"),
		chromedp.SetValue(css("input[name=default_text_model]"), "acme/text"),
		chromedp.SetValue(css("input[name=default_image_model]"), "acme/image"),
		chromedp.SetValue(css("select[name=default_provider_sort]"), "latency"),
		chromedp.SetValue(css("input[name=io_logging_sampling_rate]"), "0.0001"),
		chromedp.Click(css("input[name=is_data_discount_logging_enabled]")),
		chromedp.Click(css("input[name=is_observability_broadcast_enabled]")),
		chromedp.Click(css("input[name=is_observability_io_logging_enabled]")),
		chromedp.Click(css("input[name=filter_keys]")),
		chromedp.WaitVisible(css("input[name=io_key][value='"+wk.ID+"']")),
		chromedp.Click(css("input[name=io_key][value='"+wk.ID+"']")),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css(".ok")),
	)
	var w store.Workspace
	if err := e.DB.NewSelect().Model(&w).Where("slug = ?", "data-team").Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w.Name != name || w.Description != "Line one\nline two" || w.DefaultTextModel != "acme/text" || w.DefaultImageModel != "acme/image" ||
		w.DefaultProviderSort != "latency" || w.IOLoggingSamplingRate != 0.0001 || !w.IsDataDiscountLoggingEnabled ||
		!w.IsObservabilityBroadcastEnabled || !w.IsObservabilityIOLoggingEnabled || w.IOLoggingAPIKeyIDs == nil || *w.IOLoggingAPIKeyIDs != `["`+wk.ID+`"]` {
		t.Fatalf("stored %+v", w)
	}
	record := b.Text(t, "dl.record")
	if !contains(record, "default_guardrail_id\nnull", "io_logging_api_key_ids\n["+wk.ID+"]", "updated_at\nnull", "io_logging_sampling_rate\n0.0001") {
		t.Fatalf("record shown:\n%s", record)
	}
	// An explicit empty filter is [] (not null).
	b.Do(t,
		chromedp.SetValue(css("input[name=name]"), "Empty filter"),
		chromedp.Click(css("input[name=filter_keys]")),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css(".ok")),
	)
	until(t, b, `document.querySelector(".ok").textContent === "Created empty-filter"`)
	if err := e.DB.NewSelect().Model(&w).Where("slug = ?", "empty-filter").Scan(context.Background()); err != nil || w.IOLoggingAPIKeyIDs == nil || *w.IOLoggingAPIKeyIDs != "[]" {
		t.Fatalf("empty filter stored as %v (%v)", w.IOLoggingAPIKeyIDs, err)
	}
	b.NoErrors(t)
}

// TestKeyboard signs in and reaches the playground without a mouse: Tab
// moves to the key field, Enter submits, focus is always visible.
func TestKeyboard(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	b := browsertest.New(t, 390, 844)
	b.Do(t, chromedp.Navigate(e.HTTP.URL+"/"), chromedp.WaitVisible(css("#key")))
	tab := func(wantID string) {
		t.Helper()
		for i := 0; i < 10; i++ {
			b.Do(t, chromedp.KeyEvent("\t"))
			if id := browsertest.Get(t, b, chromedp.Evaluate[string](`document.activeElement.id`)); id == wantID {
				outline := browsertest.Get(t, b, chromedp.Evaluate[string](`getComputedStyle(document.activeElement).outlineStyle`))
				if outline == "none" {
					t.Fatalf("#%s has focus but no visible outline", wantID)
				}
				return
			}
		}
		t.Fatalf("Tab never reached #%s", wantID)
	}
	tab("key")
	b.Do(t, chromedp.KeyEvent(e.WorkspaceKey+"\r"), chromedp.WaitVisible(css("nav a[href='#/chat']")))
	b.Do(t, chromedp.Navigate(e.HTTP.URL+"/#/chat"), chromedp.WaitVisible(css("#prompt")))
	// The page's heading has focus once it is there (the playground loads
	// its interns first), so Tab starts from the page, not the header.
	until(t, b, `document.activeElement === document.querySelector("h1")`)
	tab("prompt")
	tab("send")
	b.NoErrors(t)
}
