package web_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestVaultListsAndAudit: a secret stored for the intern and one for the
// whole workspace are both listed as metadata (with fingerprints); no value
// reaches the page, its storage or the gateway's log; a delete asks for a
// second press and removes the row from the list and the database. The
// release audit shows decisions to a management key, a page at a time, and
// the API's refusal to a workspace key.
func TestVaultListsAndAudit(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	const internValue, wsValue = "intern-value-d41d8cd98f00b204", "workspace-value-e9800998ecf8427e"
	ctx := context.Background()
	secrets := func(name string) int64 {
		n, err := e.DB.NewSelect().Table("vault_secrets").Where("name = ?", name).Count(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	const internList, wsList, audit = "section[aria-labelledby=intern-secrets]", "section[aria-labelledby=workspace-secrets]", "section[aria-labelledby=audit-title]"
	b := browsertest.New(t, 390, 844)
	signIn(t, b, e.HTTP.URL+"/", e.WorkspaceKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/vault/"+e.InternID),
		chromedp.WaitReady(css("#vault-intern option[value='"+e.InternID+"']")),
		chromedp.WaitVisible(css(internList+" .note")),
		chromedp.SendKeys(css("input[name=secret_name]"), "api_token"),
		chromedp.SendKeys(css("input[name=host]"), "API.Example.com"),
		chromedp.SendKeys(css("input[name=value]"), internValue),
		chromedp.Click(css("form button[type=submit]")),
	)
	until(t, b, `document.querySelector("`+internList+` table")?.textContent.includes("api_token")`)
	// The whole workspace: the intern picker no longer matters to the store.
	browsertest.Get(t, b, chromedp.Evaluate[bool](`(() => { const s = document.querySelector("#vault-scope"); s.value = "workspace"; s.dispatchEvent(new Event("change")); return true })()`))
	b.Do(t,
		chromedp.SetValue(css("input[name=secret_name]"), "shared_token"),
		chromedp.SetValue(css("input[name=host]"), "example.org"),
		chromedp.SendKeys(css("input[name=value]"), wsValue),
		chromedp.Click(css("form button[type=submit]")),
	)
	until(t, b, `document.querySelector("`+wsList+` table")?.textContent.includes("shared_token")`)
	if got := b.Text(t, ".out .ok"); got != "Stored shared_token" {
		t.Fatalf("store message %q", got)
	}
	for _, c := range []struct{ sel, name, host string }{{internList, "api_token", "api.example.com"}, {wsList, "shared_token", "example.org"}} {
		if txt := b.Text(t, c.sel+" table"); !contains(txt, c.name, c.host, "sha256:") {
			t.Errorf("%s lists %q", c.sel, txt)
		}
	}
	if txt := b.Text(t, internList+" table"); strings.Contains(txt, "shared_token") {
		t.Errorf("the workspace secret is listed as the intern's: %q", txt)
	}
	if secrets("api_token") != 1 || secrets("shared_token") != 1 {
		t.Fatal("the stores did not reach the database")
	}
	page := browsertest.Get(t, b, chromedp.Evaluate[string](`document.documentElement.outerHTML + JSON.stringify(localStorage) + JSON.stringify(sessionStorage)`))
	for _, v := range []string{internValue, wsValue} {
		if strings.Contains(page, v) {
			t.Fatal("a secret value is on the page or in storage")
		}
		if strings.Contains(e.Logs(), v) {
			t.Fatal("a secret value reached the gateway's log")
		}
	}
	// Paging: 101 workspace secrets are a page of 100 and one behind More.
	p, err := e.Server.Auth.Bearer(ctx, "Bearer "+e.WorkspaceKey)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := e.Server.Vault.PutWorkspace(ctx, p, &cohortv1.PutWorkspaceSecretRequest{
			Name: fmt.Sprintf("bulk_%03d", i), Hosts: []string{"example.net"}, Value: "v"}); err != nil {
			t.Fatal(err)
		}
	}
	b.Do(t, chromedp.Reload(), chromedp.WaitVisible(css(wsList+" table")))
	wsRows := func() int {
		return browsertest.Get(t, b, chromedp.Evaluate[int](`document.querySelectorAll("`+wsList+` tbody tr").length`))
	}
	if n := wsRows(); n != 100 {
		t.Fatalf("first page of workspace secrets has %d rows", n)
	}
	b.Do(t, chromedp.Click(css("button[aria-label='More workspace secrets']")))
	until(t, b, `document.querySelectorAll("`+wsList+` tbody tr").length === 101`)
	if txt := b.Text(t, wsList+" tbody tr:last-child"); !strings.Contains(txt, "shared_token") {
		t.Fatalf("second page: %q", txt)
	}
	// Delete asks for a second press.
	b.Do(t, chromedp.Click(css("button[aria-label='Delete workspace secret shared_token']")))
	if secrets("shared_token") != 1 {
		t.Fatal("deleted on the first press")
	}
	b.Do(t, chromedp.Click(css("button[aria-label='Confirm delete: Delete workspace secret shared_token']")))
	until(t, b, `!(document.querySelector("`+wsList+` table")?.textContent ?? "").includes("shared_token") && document.querySelector("`+wsList+` .ok") !== null`)
	if secrets("shared_token") != 0 {
		t.Fatal("still in the database after the confirmed delete")
	}
	if got := b.Text(t, wsList+" .ok"); got != "Deleted shared_token" {
		t.Fatalf("delete message %q", got)
	}
	if secrets("api_token") != 1 {
		t.Fatal("the other secret went too")
	}
	// A workspace key is offered no audit it could only be refused: a note
	// says why.
	if msg := b.Text(t, audit+" .needs-management"); msg != "The release audit needs a management key; you are signed in with a workspace key." {
		t.Fatalf("audit with a workspace key: %q", msg)
	}
	fitsPhone(t, b, "vault with lists")

	// Decisions made by the release path itself: one allowed, refusals.
	if v, err := e.Server.Vault.ReleaseSecret(ctx, e.InternID, "api_token", "api.example.com"); err != nil || v != internValue {
		t.Fatalf("release to a bound host: %v", err)
	}
	for range 100 {
		if _, err := e.Server.Vault.ReleaseSecret(ctx, e.InternID, "api_token", "evil.example.com"); err == nil {
			t.Fatal("released to a host it is not bound to")
		}
	}
	signOutIn(t, b, e.HTTP.URL, e.ManagementKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/vault"),
		chromedp.WaitVisible(css(audit+" table")),
	)
	rows := func() int {
		return browsertest.Get(t, b, chromedp.Evaluate[int](`document.querySelectorAll("`+audit+` tbody tr").length`))
	}
	// Newest first: a page of 100 refusals, then More shows the release.
	if n := rows(); n != 100 {
		t.Fatalf("first audit page has %d rows", n)
	}
	if txt := b.Text(t, audit+" table"); !contains(txt, "refused", "host_not_allowed", "evil.example.com", "api_token") || strings.Contains(txt, "host_match") {
		t.Fatalf("first audit page: %q", txt)
	}
	b.Do(t, chromedp.Click(css("button[aria-label='More releases']")))
	until(t, b, `document.querySelectorAll("`+audit+` tbody tr").length === 101`)
	if txt := b.Text(t, audit+" tbody tr:last-child"); !contains(txt, "released", "host_match", "api.example.com", "intern") {
		t.Fatalf("oldest decision: %q", txt)
	}
	if !browsertest.Get(t, b, chromedp.Evaluate[bool](`document.querySelector("button[aria-label='More releases']").hidden`)) {
		t.Fatal("More still offered at the end")
	}
	page = browsertest.Get(t, b, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	if strings.Contains(page, internValue) || strings.Contains(e.Logs(), internValue) {
		t.Fatal("the released value reached the page or the log")
	}
	b.NoErrors(t)
}
