package web_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestWorkspaceKeySeesNoManagementForms (1280×800): signed in with a
// workspace key, the pages show no form that only a management key may use
// (creating a workspace, API keys, workload identity, the release audit),
// each replaced by a note saying why, and no call is refused; a management
// key still gets every form.
func TestWorkspaceKeySeesNoManagementForms(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	// Each page and a selector for its management-only form.
	pages := []struct{ page, form string }{
		{"workspaces", "input[name=slug]"},
		{"keys", "select[name=kind]"},
		{"federation", "form"},
		{"vault", "#audit-intern"},
	}
	b := browsertest.New(t, 1280, 800)
	signIn(t, b, e.HTTP.URL+"/", e.WorkspaceKey)
	for _, p := range pages {
		b.Do(t, chromedp.Navigate(e.HTTP.URL+"/#/"+p.page), chromedp.WaitVisible(css("h1")))
		// Wait for the page to finish loading (a form or the note).
		until(t, b, `!!document.querySelector(".needs-management") || !!document.querySelector(`+jsString(p.form)+`)`)
		if n := browsertest.Get(t, b, chromedp.Evaluate[int](`document.querySelectorAll(`+jsString(p.form)+`).length`)); n != 0 {
			t.Errorf("%s: a workspace key sees %d management form(s) (%s)", p.page, n, p.form)
		}
		if note := browsertest.Get(t, b, chromedp.Evaluate[string](`document.querySelector(".needs-management")?.textContent ?? ""`)); !contains(note, "needs a management key", "workspace key") {
			t.Errorf("%s: note %q", p.page, note)
		}
		if errs := browsertest.Get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll(".error")].map(e => e.textContent)`)); len(errs) > 0 {
			t.Errorf("%s: refusals shown: %v", p.page, errs)
		}
	}
	// Nor are those pages in its navigation.
	if links := browsertest.Get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#nav a")].map(a => a.textContent)`)); len(links) == 0 || slices.Contains(links, "API keys") || slices.Contains(links, "Workload identity") {
		t.Errorf("a workspace key's navigation: %v", links)
	}
	b.NoErrors(t)

	m := browsertest.New(t, 1280, 800)
	signIn(t, m, e.HTTP.URL+"/", e.ManagementKey)
	for _, p := range pages {
		m.Do(t, chromedp.Navigate(e.HTTP.URL+"/#/"+p.page), chromedp.WaitVisible(css(p.form)))
		if n := browsertest.Get(t, m, chromedp.Evaluate[int](`document.querySelectorAll(".needs-management").length`)); n != 0 {
			t.Errorf("%s: a management key is told it needs one", p.page)
		}
	}
	if links := browsertest.Get(t, m, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#nav a")].map(a => a.textContent)`)); !slices.Contains(links, "API keys") || !slices.Contains(links, "Workload identity") {
		t.Errorf("a management key's navigation: %v", links)
	}
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	q, _ := json.Marshal(s)
	return string(q)
}
