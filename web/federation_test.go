package web_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestFederationSettings: an issuer is added (its URL checked here as the
// service checks it); a policy whose condition breaks a rule is refused as
// the server's ValidateCondition words it, then saved with a valid one and
// two claim checks; a check is removed on its own; the enable switch pauses
// the policy; a dry run shows each check and the one that fails; the
// refused exchange appears in the audit.
func TestFederationSettings(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	b := browsertest.New(t, 390, 844)
	signIn(t, b, e.HTTP.URL+"/", e.ManagementKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/federation"),
		chromedp.WaitVisible(css("input[name=issuer_name]")),
		chromedp.SendKeys(css("input[name=issuer_name]"), "GitHub Actions"),
		chromedp.SendKeys(css("input[name=issuer_url]"), "http://token.actions.example.com"),
		chromedp.Click(css("form[aria-label=Issuer] button[type=submit]")),
	)
	if msg := b.Text(t, "#"+fieldID(t, b, "issuer_url")+"-err"); msg != "issuer_url must start with https://" {
		t.Fatalf("issuer URL check: %q", msg)
	}
	b.Do(t,
		chromedp.SetValue(css("input[name=issuer_url]"), "https://token.actions.example.com"),
		chromedp.Click(css("form[aria-label=Issuer] button[type=submit]")),
		chromedp.WaitVisible(css("button[aria-label='Edit issuer GitHub Actions']")),
	)
	var iss store.FederationIssuer
	if err := e.DB.NewSelect().Model(&iss).Scan(context.Background()); err != nil || iss.IssuerURL != "https://token.actions.example.com" {
		t.Fatalf("issuer %+v, %v", iss, err)
	}

	// The policy editor: a condition that breaks a rule.
	b.Do(t,
		chromedp.WaitReady(css("select[name=issuer_id] option[value='"+iss.ID+"']")),
		chromedp.SetValue(css("select[name=issuer_id]"), iss.ID),
		chromedp.SendKeys(css("input[name=audience]"), "cohort"),
		chromedp.SendKeys(css("textarea[name=condition]"), `subject.matches("repo:acme/.*")`),
	)
	until(t, b, `document.getElementById("condition-status").classList.contains("invalid")`)
	bad := b.Text(t, "#condition-status")
	if !strings.Contains(bad, "matches") {
		t.Fatalf("condition message %q", bad)
	}
	keyID := browsertest.Get(t, b, chromedp.Evaluate[string](`[...document.querySelectorAll("select[name=api_key_id] option")].find(o => o.textContent.startsWith("bootstrap workspace key")).value`))
	b.Do(t,
		chromedp.SetValue(css("select[name=api_key_id]"), keyID),
		chromedp.Click(css(".policy-editor button[type=submit]")),
	)
	if msg := b.Text(t, "#"+fieldID(t, b, "condition")+"-err"); msg != bad {
		t.Fatalf("submit with a bad condition: %q, want %q", msg, bad)
	}
	policies := func() []store.FederationPolicy {
		var ps []store.FederationPolicy
		if err := e.DB.NewSelect().Model(&ps).Scan(context.Background()); err != nil {
			t.Fatal(err)
		}
		return ps
	}
	if n := len(policies()); n != 0 {
		t.Fatalf("%d policies after a refused form", n)
	}
	// A valid condition, and both claim checks, added one by one.
	clear(t, b, "textarea[name=condition]")
	b.Do(t, chromedp.SendKeys(css("textarea[name=condition]"), `subject.startsWith("repo:acme/") && "deploy" in scopes`))
	until(t, b, `document.getElementById("condition-status").textContent === "The condition is valid."`)
	b.Do(t,
		chromedp.SetValue(css("select[name=new_claim_kind]"), "scopes"),
		chromedp.SendKeys(css("input[name=new_claim_value]"), "deploy"),
		chromedp.Click(css(".policy-editor fieldset .toolbar button")),
		chromedp.WaitVisible(css(".policy-editor button[aria-label='Remove the scopes check']")),
		chromedp.SendKeys(css("input[name=new_claim_value]"), "id_token"),
		chromedp.Click(css(".policy-editor fieldset .toolbar button")),
		chromedp.WaitVisible(css(".policy-editor button[aria-label='Remove the token_type check']")),
	)
	fitsPhone(t, b, "policy editor")
	screenshot(t, b, "console-policy.png")
	b.Do(t,
		chromedp.Click(css(".policy-editor button[type=submit]")),
		chromedp.WaitVisible(css("section.policy")),
	)
	ps := policies()
	if len(ps) != 1 || ps[0].Condition != `subject.startsWith("repo:acme/") && "deploy" in scopes` || ps[0].Audience != "cohort" ||
		ps[0].APIKeyID != keyID || !ps[0].Enabled || ps[0].ScopesCheck == nil || *ps[0].ScopesCheck != "deploy" ||
		ps[0].TokenTypeCheck == nil || *ps[0].TokenTypeCheck != "id_token" {
		t.Fatalf("policy %+v", ps)
	}
	pol := ps[0]
	card := b.Text(t, "section.policy")
	if !contains(card, pol.ID, "GitHub Actions", "cohort", "deploy", "id_token") {
		t.Fatalf("policy card:\n%s", card)
	}
	// Remove one check; the other stays.
	b.Do(t, chromedp.Click(css("section.policy button[aria-label='Remove the scopes check']")))
	until(t, b, `!document.querySelector("section.policy button[aria-label='Remove the scopes check']")`)
	if p := policies()[0]; p.ScopesCheck != nil || p.TokenTypeCheck == nil {
		t.Fatalf("after removing scopes: %+v", p)
	}
	// Add it back from the card, with another value.
	b.Do(t,
		chromedp.SetValue(css("section.policy select[name=claim_kind]"), "scopes"),
		chromedp.SendKeys(css("section.policy input[name=claim_value]"), "release"),
		chromedp.Click(css("section.policy form.inline button[type=submit]")),
		chromedp.WaitVisible(css("section.policy button[aria-label='Remove the scopes check']")),
	)
	if p := policies()[0]; p.ScopesCheck == nil || *p.ScopesCheck != "release" {
		t.Fatalf("after adding scopes again: %+v", p)
	}
	// The enable switch.
	b.Do(t, chromedp.Click(css("section.policy input[role=switch]")), chromedp.WaitVisible(css("section.policy .out .ok")))
	if p := policies()[0]; p.Enabled {
		t.Fatal("still enabled after the switch")
	}
	// Edit the issuer's name and the policy's audience; the switch state stays.
	b.Do(t,
		chromedp.Click(css("button[aria-label='Edit issuer GitHub Actions']")),
		chromedp.SetValue(css("input[name=issuer_name]"), "GHA"),
		chromedp.Click(css("form[aria-label=Issuer] button[type=submit]")),
		chromedp.WaitVisible(css("button[aria-label='Edit issuer GHA']")),
		chromedp.Click(css("section.policy button[aria-label='Edit this policy']")),
		chromedp.SetValue(css("input[name=audience]"), "cohort-prod"),
		chromedp.Click(css(".policy-editor button[type=submit]")),
	)
	until(t, b, `document.querySelector("section.policy").textContent.includes("cohort-prod")`)
	if p := policies()[0]; p.Audience != "cohort-prod" || p.Enabled || p.Condition != pol.Condition {
		t.Fatalf("after the edit: %+v", p)
	}
	if err := e.DB.NewSelect().Model(&iss).WherePK().Scan(context.Background()); err != nil || iss.Name != "GHA" {
		t.Fatalf("issuer after the edit: %+v, %v", iss, err)
	}
	// A dry run of a token that is not a JWT: each check, and the failure.
	b.Do(t,
		chromedp.Click(css("section.policy details.dry-run summary")),
		chromedp.SendKeys(css("section.policy textarea[name=subject_token]"), "not-a-jwt"),
		chromedp.Click(css("section.policy details.dry-run button[type=submit]")),
		chromedp.WaitVisible(css("section.policy ol.steps")),
	)
	failed := browsertest.Get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("section.policy ol.steps li.failed")].map(li => li.dataset.check)`))
	if len(failed) != 1 || !strings.Contains(b.Text(t, "section.policy details.dry-run"), "would be refused: "+failed[0]+" fails") {
		t.Fatalf("dry run: failed %v\n%s", failed, b.Text(t, "section.policy details.dry-run"))
	}
	// An exchange against the paused policy is refused and audited.
	form := url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:token-exchange"}, "subject_token_type": {"urn:ietf:params:oauth:token-type:jwt"},
		"subject_token": {"eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJyZXBvOmFjbWUveCJ9.c2ln"}, "federation_policy_id": {pol.ID}}
	if status, body, _ := e.Do(t, "POST", "/oauth/token", "", "application/x-www-form-urlencoded", form.Encode()); status != 400 {
		t.Fatalf("exchange: %d %s", status, body)
	}
	b.Do(t,
		chromedp.Click(css("button[aria-label='Refresh the audit']")),
		chromedp.WaitVisible(css("table[data-audit] tbody tr")),
	)
	if audit := b.Text(t, "table[data-audit]"); !contains(audit, "refused") {
		t.Fatalf("audit:\n%s", audit)
	}
	fitsPhone(t, b, "policy card")
	b.NoErrors(t)
}
