package web_test

import (
	"context"
	"strings"
	"testing"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestAPIKeys: a new key is shown once (with a copy button) and works; it is
// listed by prefix only; disable, enable and delete act on it at once.
func TestAPIKeys(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	b := browsertest.New(t, 390, 844)
	signIn(t, b, e.HTTP.URL+"/", e.ManagementKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/keys"),
		chromedp.WaitVisible(css("table")),
		chromedp.SetValue(css("select[name=kind]"), "workspace"),
		chromedp.SendKeys(css("input[name=key_name]"), "ci runner"),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css("#new-key")),
	)
	key := browsertest.Get(t, b, chromedp.Value(css("#new-key")))
	if !strings.HasPrefix(key, "cohort_wk_") {
		t.Fatalf("new key %q", key)
	}
	if status, _, _ := e.Do(t, "POST", "/cohort.v1.WorkspaceService/ListWorkspaces", key, "application/json", "{}"); status != 200 {
		t.Fatalf("the new key does not work: %d", status)
	}
	// The copy button puts the key on the clipboard (read back with the
	// page's clipboard permission granted).
	for _, name := range []string{"clipboard-read", "clipboard-write"} {
		if _, err := chromedp.CallBrowser(b.Ctx, cdpbrowser.SetPermission, cdpbrowser.SetPermissionParams{
			Permission: &cdpbrowser.PermissionDescriptor{Name: name}, Setting: cdpbrowser.PermissionSettingGranted, Origin: e.HTTP.URL}); err != nil {
			t.Fatal(err)
		}
	}
	b.Do(t, chromedp.Click(css(".once button")))
	until(t, b, `document.querySelector(".once [role=status]").textContent === "Copied."`)
	if clip := browsertest.Get(t, b, chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise)); clip != key {
		t.Fatalf("clipboard holds %d characters, not the key", len(clip))
	}
	listed := b.Text(t, "table")
	if !strings.Contains(listed, "ci runner") || strings.Contains(listed, key) || !strings.Contains(listed, key[:12]) {
		t.Fatalf("list shows %q", listed)
	}
	// Dismissed, the key is gone from the page; it was never stored.
	b.Do(t, chromedp.Click(css(".once button.secondary")))
	page := browsertest.Get(t, b, chromedp.Evaluate[string](`document.documentElement.outerHTML + JSON.stringify(localStorage) + JSON.stringify(sessionStorage)`))
	if strings.Contains(page, key) {
		t.Fatal("the key is still on the page or in storage after dismissal")
	}

	keyState := func() (disabled, deleted bool) {
		var k store.APIKey
		if err := e.DB.NewSelect().Model(&k).Where("name = ?", "ci runner").Scan(context.Background()); err != nil {
			t.Fatal(err)
		}
		return k.DisabledAt != nil, k.DeletedAt != nil
	}
	b.Do(t, chromedp.Click(css("button[aria-label='Disable ci runner']")), chromedp.WaitVisible(css("button[aria-label='Enable ci runner']")))
	if d, _ := keyState(); !d {
		t.Fatal("not disabled")
	}
	if status, _, _ := e.Do(t, "POST", "/cohort.v1.WorkspaceService/ListWorkspaces", key, "application/json", "{}"); status != 401 {
		t.Fatalf("a disabled key answers %d", status)
	}
	b.Do(t, chromedp.Click(css("button[aria-label='Enable ci runner']")), chromedp.WaitVisible(css("button[aria-label='Disable ci runner']")))
	if d, _ := keyState(); d {
		t.Fatal("not enabled again")
	}
	// Delete asks for a second press.
	b.Do(t, chromedp.Click(css("button[aria-label='Delete ci runner']")))
	if _, del := keyState(); del {
		t.Fatal("deleted on the first press")
	}
	b.Do(t, chromedp.Click(css("button[aria-label='Confirm delete: Delete ci runner']")))
	until(t, b, `!document.querySelector("table").textContent.includes("ci runner")`)
	if _, del := keyState(); !del {
		t.Fatal("not deleted")
	}
	// A workspace key is told the page needs a management key, with no
	// forms that the admin service would only refuse.
	signOutIn(t, b, e.HTTP.URL, e.WorkspaceKey)
	b.Do(t, chromedp.Navigate(e.HTTP.URL+"/#/keys"), chromedp.WaitVisible(css(".needs-management")))
	if msg := b.Text(t, ".needs-management"); !strings.Contains(msg, "management key") || !strings.Contains(msg, "workspace key") {
		t.Fatalf("workspace key on the keys page: %q", msg)
	}
	b.NoErrors(t)
}

// signOutIn signs out from the header and in again with key.
func signOutIn(t *testing.T, b *browsertest.Browser, base, key string) {
	t.Helper()
	b.Do(t, chromedp.Click(css("nav button.link")), chromedp.WaitVisible(css("#key")))
	signIn(t, b, base+"/", key)
}

// TestVaultStore: a secret is stored with its hosts; the page shows the
// metadata the API returned (normalized hosts, fingerprint) and never the
// value, which is cleared from its field. Client-side checks mirror the
// service's and send nothing; what only the service knows is shown as it
// words it.
func TestVaultStore(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	const value = "s3cr3t-value-for-the-browser-test"
	b := browsertest.New(t, 390, 844)
	signIn(t, b, e.HTTP.URL+"/", e.WorkspaceKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/vault/"+e.InternID),
		chromedp.WaitReady(css("#vault-intern option[value='"+e.InternID+"']")),
		chromedp.SendKeys(css("input[name=secret_name]"), "api_token"),
		chromedp.SendKeys(css("input[name=host]"), "https://API.Example.com"),
		chromedp.SendKeys(css("input[name=value]"), value),
		chromedp.Click(css("form button[type=submit]")),
	)
	if msg := b.Text(t, "ol.hosts .field-error"); msg != "schemes are not allowed: give the bare hostname" {
		t.Fatalf("host check: %q", msg)
	}
	count := func() int64 {
		n, err := e.DB.NewSelect().Table("vault_secrets").Count(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 0 {
		t.Fatalf("%d secrets after a refused form", n)
	}
	b.Do(t,
		chromedp.SetValue(css("input[name=host]"), "API.Example.com."),
		chromedp.Click(css("fieldset button.secondary:not([aria-label])")), // Add host
		chromedp.WaitVisible(css("ol.hosts li:nth-child(2) input")),
		chromedp.SendKeys(css("ol.hosts li:nth-child(2) input"), "example.org"),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css(".out .ok")),
	)
	out := b.Text(t, ".out")
	if !contains(out, "Stored api_token", "api.example.com, example.org", "sha256:") {
		t.Fatalf("metadata shown: %q", out)
	}
	if v := browsertest.Get(t, b, chromedp.Value(css("input[name=value]"))); v != "" {
		t.Fatalf("value field kept %d characters", len(v))
	}
	if typ := browsertest.Get(t, b, chromedp.Evaluate[string](`document.querySelector("input[name=value]").type`)); typ != "password" {
		t.Fatalf("value input is %q", typ)
	}
	fp := b.Text(t, ".out dd:nth-of-type(3)")
	// The same value again replaces it and keeps the fingerprint.
	b.Do(t,
		chromedp.SendKeys(css("input[name=value]"), value),
		chromedp.Click(css("form button[type=submit]")),
	)
	until(t, b, `document.querySelector(".out .ok").textContent === "Replaced api_token"`)
	if fp2 := b.Text(t, ".out dd:nth-of-type(3)"); fp2 != fp {
		t.Fatalf("fingerprint changed on the same value: %q then %q", fp, fp2)
	}
	// The service's own rule, past the client's (lifted) pattern.
	b.Do(t,
		chromedp.SetAttributeValue(css("input[name=secret_name]"), "pattern", ".*"),
		chromedp.SetValue(css("input[name=secret_name]"), "a__b"),
		chromedp.SendKeys(css("input[name=value]"), value),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css(".out .error")),
	)
	if msg := b.Text(t, ".out .error"); msg != "name must not hold two underscores in a row" {
		t.Fatalf("server refusal shown as %q", msg)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d secrets, want 1", n)
	}
	page := browsertest.Get(t, b, chromedp.Evaluate[string](`document.documentElement.outerHTML + JSON.stringify(localStorage) + JSON.stringify(sessionStorage)`))
	if strings.Contains(page, value) {
		t.Fatal("the secret value is on the page or in storage")
	}
	if strings.Contains(e.Logs(), value) {
		t.Fatal("the secret value reached the gateway's log")
	}
	// A management key selects no workspace: refused as the API words it.
	signOutIn(t, b, e.HTTP.URL, e.ManagementKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/vault/"+e.InternID),
		chromedp.WaitReady(css("#vault-intern option[value='"+e.InternID+"']")),
		chromedp.SendKeys(css("input[name=secret_name]"), "other"),
		chromedp.SendKeys(css("input[name=host]"), "example.com"),
		chromedp.SendKeys(css("input[name=value]"), "x"),
		chromedp.Click(css("form button[type=submit]")),
		chromedp.WaitVisible(css(".out .error")),
	)
	if msg := b.Text(t, ".out .error"); !strings.HasPrefix(msg, "a management key selects no workspace") {
		t.Fatalf("management key on the vault: %q", msg)
	}
	b.NoErrors(t)
}

// TestInterns: create with a model, change it, suspend, resume, delete; the
// state column follows the API.
func TestInterns(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	b := browsertest.New(t, 390, 844)
	signIn(t, b, e.HTTP.URL+"/", e.ManagementKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/interns"),
		chromedp.WaitVisible(css("table")),
		chromedp.SendKeys(css("input[name=intern_name]"), "helper"),
		chromedp.SetValue(css("input[name=model]"), "acme/large"),
		chromedp.Click(css("form:not(.inline) button[type=submit]")),
		chromedp.WaitVisible(css("button[aria-label='Suspend helper']")),
	)
	load := func() store.Intern {
		var in store.Intern
		if err := e.DB.NewSelect().Model(&in).Where("name = ?", "helper").Scan(context.Background()); err != nil {
			t.Fatal(err)
		}
		return in
	}
	if in := load(); in.Model != "acme/large" || in.State != store.InternProvisioning {
		t.Fatalf("created %s in %s", in.Model, in.State)
	}
	// The table re-renders after each action: click by selector at the
	// moment of the click (click), not a node looked up before it.
	b.Do(t, chromedp.SetValue(css("input[aria-label='Model of helper']"), "acme/small"))
	click(t, b, "button[aria-label='Save the model of helper']")
	until(t, b, `document.querySelector(".ok") && document.querySelector(".ok").textContent.startsWith("Model changed")`)
	if in := load(); in.Model != "acme/small" {
		t.Fatalf("model %s", in.Model)
	}
	// The agent is the gateway's to allow: a name outside its catalog is
	// refused with the names it allows, and nothing changes.
	if in := load(); in.Agent != "" {
		t.Fatalf("created with agent %q, want the built-in one", in.Agent)
	}
	b.Do(t, chromedp.SetValue(css("input[aria-label='Agent of helper']"), "claude"))
	click(t, b, "button[aria-label='Save the agent of helper']")
	until(t, b, `[...document.querySelectorAll(".error")].some(e => e.textContent.includes('agent must be "cohort"'))`)
	if in := load(); in.Agent != "" {
		t.Fatalf("refused agent stored: %q", in.Agent)
	}
	click(t, b, "button[aria-label='Suspend helper']")
	b.Do(t, chromedp.WaitVisible(css("button[aria-label='Resume helper']")))
	if in := load(); in.State != store.InternSuspended {
		t.Fatalf("state %s after suspend", in.State)
	}
	click(t, b, "button[aria-label='Resume helper']")
	b.Do(t, chromedp.WaitVisible(css("button[aria-label='Suspend helper']")))
	click(t, b, "button[aria-label='Delete helper']")
	click(t, b, "button[aria-label='Confirm delete: Delete helper']")
	until(t, b, `!document.querySelector("table").textContent.includes("helper")`)
	if in := load(); in.State != store.InternDeleted {
		t.Fatalf("state %s after delete", in.State)
	}
	// A blank model is refused here, before the API.
	b.Do(t,
		chromedp.SendKeys(css("input[name=intern_name]"), "x"),
		chromedp.SetValue(css("input[name=model]"), " "),
		chromedp.Click(css("form:not(.inline) button[type=submit]")),
	)
	if msg := b.Text(t, "#"+fieldID(t, b, "model")+"-err"); msg != "model is required" {
		t.Fatalf("blank model: %q", msg)
	}
	b.NoErrors(t)
}

// TestPagesFitAPhone visits every page at 390 px: nothing makes the page
// scroll sideways (tables scroll in their own region), every control has a
// label, and every clickable thing is a button or a link.
func TestPagesFitAPhone(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	b := browsertest.New(t, 390, 844)
	signIn(t, b, e.HTTP.URL+"/", e.ManagementKey)
	for _, page := range []string{"workspaces", "keys", "interns", "chat", "vault", "federation"} {
		b.Do(t, chromedp.Navigate(e.HTTP.URL+"/#/"+page), chromedp.WaitVisible(css("h1")))
		until(t, b, `document.querySelectorAll("select option").length > 0 || !document.querySelector("select")`)
		fitsPhone(t, b, page)
		unlabelled := browsertest.Get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("input, select, textarea")]
			.filter(el => el.labels.length === 0 && !el.getAttribute("aria-label")).map(el => el.name || el.id)`))
		if len(unlabelled) > 0 {
			t.Errorf("%s: controls without a label: %v", page, unlabelled)
		}
		clickables := browsertest.Get(t, b, chromedp.Evaluate[int](`[...document.querySelectorAll("[onclick], [role=button], div[tabindex]:not(.table-wrap), span[tabindex]")].length`))
		if clickables > 0 {
			t.Errorf("%s: %d clickable elements that are not buttons or links", page, clickables)
		}
	}
	b.NoErrors(t)
}
