package federation_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
)

// TestInvalidGrantIsOneAnswer sends tokens and policies that fail every
// check in turn. Each answer is 400 invalid_grant with a body byte for byte
// identical to the others; the audit names the precise check.
func TestInvalidGrantIsOneAnswer(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		ctx := context.Background()
		mk := f.ManagementKey
		sub := "repo:acme/app:ref:refs/heads/main"
		policy := func(req *cohortv1.CreatePolicyRequest) string {
			if req.IssuerId == "" {
				req.IssuerId = f.issuerID
			}
			if req.Audience == "" {
				req.Audience = "cohort"
			}
			if req.ApiKeyId == "" {
				req.ApiKeyId = f.keyID
			}
			return call(t, f.client.CreatePolicy, mk, req).GetPolicy().GetId()
		}
		polScopes := policy(&cohortv1.CreatePolicyRequest{Subject: sub, ClaimChecks: []*cohortv1.ClaimCheck{{Kind: "scopes", Value: "deploy"}}})
		polType := policy(&cohortv1.CreatePolicyRequest{Subject: sub, ClaimChecks: []*cohortv1.ClaimCheck{{Kind: "token_type", Value: "JWT"}}})
		polCondFalse := policy(&cohortv1.CreatePolicyRequest{Condition: `subject.startsWith("repo:other/")`})
		polCondScopes := policy(&cohortv1.CreatePolicyRequest{Condition: `"deploy" in scopes`})
		polCondError := policy(&cohortv1.CreatePolicyRequest{Condition: `audience[3] == "x"`})
		polPaused := policy(&cohortv1.CreatePolicyRequest{Subject: sub, Enabled: new(bool)})
		polDeleted := policy(&cohortv1.CreatePolicyRequest{Subject: sub})
		call(t, f.client.DeletePolicy, mk, &cohortv1.DeletePolicyRequest{Id: polDeleted})
		iss2 := call(t, f.client.CreateIssuer, mk, &cohortv1.CreateIssuerRequest{Name: "gone", IssuerUrl: p.URL + "/gone"}).GetIssuer().GetId()
		polIssuerGone := policy(&cohortv1.CreatePolicyRequest{IssuerId: iss2, Subject: sub})
		call(t, f.client.DeleteIssuer, mk, &cohortv1.DeleteIssuerRequest{Id: iss2})
		disabledKey := keyID(t, db, f.NewKey(t, "workspace", f.WorkspaceID))
		polKeyOff := policy(&cohortv1.CreatePolicyRequest{Subject: sub, ApiKeyId: disabledKey})
		f.Server.Accounts.DisableAPIKey(ctx, f.Operator(), disabledKey)
		// Another organization trusts the same issuer and audience, for
		// another subject: our token cannot use its policy.
		other := newOtherOrg(t, f, true)
		otherIss := call(t, f.client.CreateIssuer, other.managementKey, &cohortv1.CreateIssuerRequest{Name: "same idp", IssuerUrl: p.URL}).GetIssuer().GetId()
		polOther := call(t, f.client.CreatePolicy, other.managementKey, &cohortv1.CreatePolicyRequest{IssuerId: otherIss,
			Subject: "repo:other/app:ref:refs/heads/main", Audience: "cohort", ApiKeyId: other.workspaceKeyID}).GetPolicy().GetId()

		pub, _ := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
		pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})
		with := func(change func(c map[string]any)) map[string]any {
			c := p.claims()
			change(c)
			return c
		}
		rs := func(c map[string]any) string { return p.token(t, kidRSA, c) }
		good := rs(p.claims())
		parts := strings.Split(good, ".")
		long := func(n int) string { return strings.Repeat("s", n) }

		cases := []struct {
			name, form, check string
		}{
			{"unknown policy", exchangeForm(good, uuid.NewString()), ""},
			{"policy of another organization", exchangeForm(good, polOther), "subject"},
			{"paused policy", exchangeForm(good, polPaused), "policy_enabled"},
			{"deleted policy", exchangeForm(good, polDeleted), ""},
			{"deleted issuer", exchangeForm(good, polIssuerGone), ""},
			{"disabled target key", exchangeForm(good, polKeyOff), "api_key"},
			{"alg none", exchangeForm(sign(t, `{"alg":"none","kid":"rsa-1"}`, mustJSON(p.claims()), nil), f.policyID), "algorithm"},
			{"HS256 keyed with the public key", exchangeForm(sign(t, `{"alg":"HS256","kid":"rsa-1"}`, mustJSON(p.claims()), pubPEM), f.policyID), "algorithm"},
			{"ES384", exchangeForm(sign(t, `{"alg":"ES384","kid":"ec-1"}`, mustJSON(p.claims()), p384Key), f.policyID), "algorithm"},
			{"no kid", exchangeForm(sign(t, `{"alg":"RS256"}`, mustJSON(p.claims()), rsaKey), f.policyID), "algorithm"},
			{"crit names an unknown extension", exchangeForm(sign(t, `{"alg":"RS256","kid":"rsa-1","crit":["exp-ext"],"exp-ext":1}`, mustJSON(p.claims()), rsaKey), f.policyID), "algorithm"},
			{"unknown kid", exchangeForm(p.token(t, "nope", p.claims()), f.policyID), "signature"},
			{"ES256 header on the RSA key", exchangeForm(sign(t, `{"alg":"ES256","kid":"rsa-1"}`, mustJSON(p.claims()), ecKey), f.policyID), "signature"},
			{"RS256 header on the EC key", exchangeForm(sign(t, `{"alg":"RS256","kid":"ec-1"}`, mustJSON(p.claims()), rsaKey), f.policyID), "signature"},
			{"signed by another key", exchangeForm(sign(t, `{"alg":"RS256","kid":"rsa-1"}`, mustJSON(p.claims()), rsaKey2), f.policyID), "signature"},
			{"tampered payload", exchangeForm(parts[0]+"."+b64([]byte(mustJSON(with(func(c map[string]any) { c["sub"] = "repo:evil" }))))+"."+parts[2], f.policyID), "signature"},
			{"expired", exchangeForm(rs(with(func(c map[string]any) { c["exp"] = time.Now().Unix() - 60 })), f.policyID), "expiry"},
			{"expired a second ago (no leeway on exp)", exchangeForm(rs(with(func(c map[string]any) { c["exp"] = time.Now().Unix() - 1 })), f.policyID), "expiry"},
			{"nbf in the future", exchangeForm(rs(with(func(c map[string]any) { c["nbf"] = time.Now().Unix() + 600 })), f.policyID), "expiry"},
			{"exp missing", exchangeForm(rs(with(func(c map[string]any) { delete(c, "exp") })), f.policyID), "expiry"},
			{"exp 0", exchangeForm(rs(with(func(c map[string]any) { c["exp"] = 0 })), f.policyID), "expiry"},
			{"exp a string", exchangeForm(rs(with(func(c map[string]any) { c["exp"] = "9999999999" })), f.policyID), "expiry"},
			{"iss another", exchangeForm(rs(with(func(c map[string]any) { c["iss"] = p.URL + "/" })), f.policyID), "issuer"},
			{"iss missing", exchangeForm(rs(with(func(c map[string]any) { delete(c, "iss") })), f.policyID), "issuer"},
			{"aud missing", exchangeForm(rs(with(func(c map[string]any) { delete(c, "aud") })), f.policyID), "audience"},
			{"aud another string", exchangeForm(rs(with(func(c map[string]any) { c["aud"] = "Cohort" })), f.policyID), "audience"},
			{"aud array without ours", exchangeForm(rs(with(func(c map[string]any) { c["aud"] = []string{"a", "b"} })), f.policyID), "audience"},
			{"aud array with a number", exchangeForm(rs(with(func(c map[string]any) { c["aud"] = []any{"cohort", 7} })), f.policyID), "audience"},
			{"aud 513 characters", exchangeForm(rs(with(func(c map[string]any) { c["aud"] = []string{"cohort", long(513)} })), f.policyID), "token_limits"},
			{"sub another", exchangeForm(rs(with(func(c map[string]any) { c["sub"] = "repo:acme/app:ref:refs/heads/dev" })), f.policyID), "subject"},
			{"sub missing", exchangeForm(rs(with(func(c map[string]any) { delete(c, "sub") })), f.policyID), "subject"},
			{"sub a number", exchangeForm(rs(with(func(c map[string]any) { c["sub"] = 42 })), f.policyID), "subject"},
			{"sub 513 characters", exchangeForm(rs(with(func(c map[string]any) { c["sub"] = long(513) })), f.policyID), "token_limits"},
			{"17 scopes", exchangeForm(rs(with(func(c map[string]any) { c["scopes"] = strings.Split(strings.Repeat("a,", 16)+"a", ",") })), f.policyID), "token_limits"},
			{"a scope of 513 characters", exchangeForm(rs(with(func(c map[string]any) { c["scopes"] = []string{long(513)} })), f.policyID), "token_limits"},
			{"scopes check, no scopes claim", exchangeForm(good, polScopes), "claim_scopes"},
			{"scopes check, scope=inference in the form", exchangeForm(good, polScopes, "scope", "inference"), "claim_scopes"},
			{"scopes check, space-separated string", exchangeForm(rs(with(func(c map[string]any) { c["scopes"] = "deploy read" })), polScopes), "claim_scopes"},
			{"scopes check, scope claim instead", exchangeForm(rs(with(func(c map[string]any) { c["scope"] = "deploy" })), polScopes), "claim_scopes"},
			{"scopes check, case differs", exchangeForm(rs(with(func(c map[string]any) { c["scopes"] = []string{"Deploy"} })), polScopes), "claim_scopes"},
			{"scopes check, number in the array", exchangeForm(rs(with(func(c map[string]any) { c["scopes"] = []any{"deploy", 1} })), polScopes), "claim_scopes"},
			{"token_type check, claim missing (header typ is JWT)", exchangeForm(good, polType), "claim_token_type"},
			{"token_type check, a number", exchangeForm(rs(with(func(c map[string]any) { c["token_type"] = 1 })), polType), "claim_token_type"},
			{"token_type check, another value", exchangeForm(rs(with(func(c map[string]any) { c["token_type"] = "jwt" })), polType), "claim_token_type"},
			{"condition false", exchangeForm(good, polCondFalse), "condition"},
			{"condition over a wrongly typed scopes", exchangeForm(rs(with(func(c map[string]any) { c["scopes"] = "deploy" })), polCondScopes), "condition"},
			{"condition raises an error", exchangeForm(good, polCondError), "condition"},
		}
		var first string
		for _, tc := range cases {
			a := f.post(t, tc.form)
			expectError(t, a, 400, "invalid_grant")
			if first == "" {
				first = a.body
				var m map[string]string
				json.Unmarshal([]byte(first), &m)
				if len(m) != 2 || m["error_description"] == "" {
					t.Fatalf("invalid_grant body %s", first)
				}
			} else if a.body != first {
				t.Errorf("%s: body %q differs from %q", tc.name, a.body, first)
			}
		}
		// Losing the entitlement stops exchanges at once.
		setEntitlement(t, f, false)
		if a := f.exchange(t, good); a.body != first {
			t.Errorf("entitlement lost: %d %s", a.status, a.body)
		}
		setEntitlement(t, f, true)
		issued(t, f.exchange(t, good))

		// The audit holds the precise cause of each refusal that named an
		// existing policy; the others (no policy, so no organization to
		// tell) are only logged.
		rows := f.audit(t)
		var got []string
		for i := len(rows) - 1; i >= 0; i-- {
			got = append(got, rows[i].GetFailedCheck())
		}
		var want []string
		for _, tc := range cases {
			if tc.check != "" && tc.name != "policy of another organization" {
				want = append(want, tc.check)
			}
		}
		want = append(want, "entitlement", "")
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("audit causes\n got %v\nwant %v", got, want)
		}
		for _, r := range rows {
			if r.GetFailedCheck() != "" && (r.GetOutcome() != "refused" || r.GetDetail() == "" || r.GetTokenId() != "") {
				t.Fatalf("refusal row %v", r)
			}
		}
		// The other organization sees the refusal on its own policy.
		otherRows := call(t, f.client.ListExchanges, other.managementKey, &cohortv1.ListExchangesRequest{}).GetExchanges()
		if len(otherRows) != 1 || otherRows[0].GetFailedCheck() != "subject" || otherRows[0].GetPolicyId() != polOther {
			t.Fatalf("other organization's audit: %v", otherRows)
		}
		// Neither a subject token nor an access token is ever logged or
		// audited.
		for _, tc := range cases {
			tok := strings.Split(strings.Split(tc.form, "subject_token=")[1], "&")[0]
			sig := tok[strings.LastIndex(tok, ".")+1:]
			if len(sig) > 20 && strings.Contains(f.Logs(), sig) {
				t.Fatalf("%s: the subject token reached the log", tc.name)
			}
		}
		for _, r := range rows {
			if strings.Contains(r.String(), parts[2]) {
				t.Fatalf("a token reached the audit: %v", r)
			}
		}
	})
}

func setEntitlement(t testing.TB, f *fed, on bool) {
	t.Helper()
	if _, err := f.Server.Accounts.SetEntitlements(context.Background(), f.Operator(), f.OrganizationID,
		&cohortv1.Entitlements{InternsProgramme: true, WorkloadIdentity: on, VaultWrites: true}); err != nil {
		t.Fatal(err)
	}
}
