package federation_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/federation"
)

// refusal checks a Connect error: code and a message containing want.
func refusal(t *testing.T, name string, err error, code connect.Code, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: accepted", name)
		return
	}
	if connect.CodeOf(err) != code || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v, want %v containing %q", name, err, code, want)
	}
}

// snapshot counts the federation tables, to check that a refusal changed
// nothing.
func snapshot(t *testing.T, db *bun.DB) [3]int {
	return [3]int{count(t, db, "federation_issuers"), count(t, db, "federation_policies"), count(t, db, "federation_exchanges")}
}

func TestIssuerValidation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		mk := f.ManagementKey
		before := snapshot(t, db)
		for _, tc := range []struct {
			name string
			req  *cohortv1.CreateIssuerRequest
			want string
		}{
			{"http", &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: "http://idp.example"}, "https://"},
			{"no scheme", &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: "idp.example"}, "https://"},
			{"no host", &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: "https:///path"}, "host"},
			{"query", &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: "https://idp.example/?tenant=1"}, "query"},
			{"fragment", &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: "https://idp.example/#x"}, "fragment"},
			{"credentials", &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: "https://u:p@idp.example"}, "credentials"},
			{"space", &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: "https://idp.example "}, "spaces"},
			{"too long", &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: "https://idp.example/" + strings.Repeat("a", 1005)}, "1024"},
			{"missing", &cohortv1.CreateIssuerRequest{Name: "x"}, "issuer_url is required"},
			{"no name", &cohortv1.CreateIssuerRequest{IssuerUrl: "https://idp.example"}, "name is required"},
			{"name 101", &cohortv1.CreateIssuerRequest{Name: strings.Repeat("n", 101), IssuerUrl: "https://idp.example"}, "100"},
			{"jwks http", &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: "https://idp.example", JwksUrl: "http://idp.example/jwks"}, "jwks_url must start with https://"},
			{"duplicate", &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: p.URL}, "already exists"},
		} {
			_, err := try(f.client.CreateIssuer, mk, tc.req)
			code := connect.CodeInvalidArgument
			if tc.name == "duplicate" {
				code = connect.CodeFailedPrecondition
			}
			refusal(t, tc.name, err, code, tc.want)
		}
		// At the bounds: a 1024-byte URL and a 100-character name.
		u := "https://idp.example/" + strings.Repeat("a", 1004)
		call(t, f.client.CreateIssuer, mk, &cohortv1.CreateIssuerRequest{Name: strings.Repeat("n", 100), IssuerUrl: u})
		if got := snapshot(t, db); got != [3]int{before[0] + 1, before[1], before[2]} {
			t.Fatalf("refusals changed the database: %v → %v", before, got)
		}
		// The issuer URL is kept byte for byte (never normalised).
		odd := "https://IDP.example:443/a/../b/"
		got := call(t, f.client.CreateIssuer, mk, &cohortv1.CreateIssuerRequest{Name: "odd", IssuerUrl: odd}).GetIssuer()
		if got.GetIssuerUrl() != odd {
			t.Fatalf("issuer URL stored as %q", got.GetIssuerUrl())
		}
		// Update: validated the same way; "" goes back to discovery.
		_, err := try(f.client.UpdateIssuer, mk, &cohortv1.UpdateIssuerRequest{Id: got.GetId(), IssuerUrl: new("http://x")})
		refusal(t, "update to http", err, connect.CodeInvalidArgument, "https://")
		j := "https://idp.example/keys"
		up := call(t, f.client.UpdateIssuer, mk, &cohortv1.UpdateIssuerRequest{Id: got.GetId(), JwksUrl: &j}).GetIssuer()
		if up.GetJwksUrl() != j || up.GetName() != "odd" || up.GetUpdatedAt() == nil {
			t.Fatalf("update %v", up)
		}
		empty := ""
		if up = call(t, f.client.UpdateIssuer, mk, &cohortv1.UpdateIssuerRequest{Id: got.GetId(), JwksUrl: &empty}).GetIssuer(); up.GetJwksUrl() != "" {
			t.Fatalf("jwks_url not cleared: %v", up)
		}
		if n := len(call(t, f.client.ListIssuers, mk, &cohortv1.ListIssuersRequest{}).GetIssuers()); n != 3 {
			t.Fatalf("%d issuers", n)
		}
		_, err = try(f.client.GetIssuer, mk, &cohortv1.GetIssuerRequest{Id: "nope"})
		refusal(t, "get unknown", err, connect.CodeNotFound, "not found")
		// Deleting an issuer deletes its policies.
		res := call(t, f.client.DeleteIssuer, mk, &cohortv1.DeleteIssuerRequest{Id: f.issuerID})
		if res.GetDeletedPolicies() != 1 {
			t.Fatalf("deleted %d policies", res.GetDeletedPolicies())
		}
		_, err = try(f.client.GetPolicy, mk, &cohortv1.GetPolicyRequest{Id: f.policyID})
		refusal(t, "policy of a deleted issuer", err, connect.CodeNotFound, "not found")
	})
}

func TestPolicyValidation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		ctx := context.Background()
		mk := f.ManagementKey
		personal := keyID(t, db, f.NewKey(t, "personal", f.WorkspaceID))
		management := keyID(t, db, f.ManagementKey)
		deleted := keyID(t, db, f.NewKey(t, "workspace", f.WorkspaceID))
		f.Server.Accounts.DeleteAPIKey(ctx, f.Operator(), deleted)
		other := newOtherOrg(t, f, true)
		otherIssuer := call(t, f.client.CreateIssuer, other.managementKey, &cohortv1.CreateIssuerRequest{Name: "o", IssuerUrl: p.URL}).GetIssuer().GetId()
		base := func(change func(r *cohortv1.CreatePolicyRequest)) *cohortv1.CreatePolicyRequest {
			r := &cohortv1.CreatePolicyRequest{IssuerId: f.issuerID, Subject: "s", Audience: "cohort", ApiKeyId: f.keyID}
			change(r)
			return r
		}
		before := snapshot(t, db)
		for _, tc := range []struct {
			name string
			req  *cohortv1.CreatePolicyRequest
			code connect.Code
			want string
		}{
			{"neither subject nor condition", base(func(r *cohortv1.CreatePolicyRequest) { r.Subject = "" }), connect.CodeInvalidArgument, "subject, a condition, or both"},
			{"no audience", base(func(r *cohortv1.CreatePolicyRequest) { r.Audience = "" }), connect.CodeInvalidArgument, "audience is required"},
			{"audience 513", base(func(r *cohortv1.CreatePolicyRequest) { r.Audience = strings.Repeat("a", 513) }), connect.CodeInvalidArgument, "512"},
			{"subject 513", base(func(r *cohortv1.CreatePolicyRequest) { r.Subject = strings.Repeat("a", 513) }), connect.CodeInvalidArgument, "512"},
			{"personal key", base(func(r *cohortv1.CreatePolicyRequest) { r.ApiKeyId = personal }), connect.CodeInvalidArgument, "personal keys cannot be targeted"},
			{"management key", base(func(r *cohortv1.CreatePolicyRequest) { r.ApiKeyId = management }), connect.CodeInvalidArgument, "management keys cannot be targeted"},
			{"deleted key", base(func(r *cohortv1.CreatePolicyRequest) { r.ApiKeyId = deleted }), connect.CodeNotFound, "not found"},
			{"key of another organization", base(func(r *cohortv1.CreatePolicyRequest) { r.ApiKeyId = other.workspaceKeyID }), connect.CodeNotFound, "not found"},
			{"no key", base(func(r *cohortv1.CreatePolicyRequest) { r.ApiKeyId = "" }), connect.CodeInvalidArgument, "api_key_id is required"},
			{"issuer of another organization", base(func(r *cohortv1.CreatePolicyRequest) { r.IssuerId = otherIssuer }), connect.CodeNotFound, "issuer"},
			{"bad condition", base(func(r *cohortv1.CreatePolicyRequest) { r.Condition = `subject.matches("x")` }), connect.CodeInvalidArgument, "matches()"},
			{"claim check twice", base(func(r *cohortv1.CreatePolicyRequest) {
				r.ClaimChecks = []*cohortv1.ClaimCheck{{Kind: "scopes", Value: "a"}, {Kind: "scopes", Value: "b"}}
			}), connect.CodeInvalidArgument, "given twice"},
			{"claim check kind", base(func(r *cohortv1.CreatePolicyRequest) {
				r.ClaimChecks = []*cohortv1.ClaimCheck{{Kind: "scope", Value: "a"}}
			}), connect.CodeInvalidArgument, "scopes or token_type"},
			{"claim check empty", base(func(r *cohortv1.CreatePolicyRequest) { r.ClaimChecks = []*cohortv1.ClaimCheck{{Kind: "token_type"}} }), connect.CodeInvalidArgument, "needs a value"},
			{"claim check 513", base(func(r *cohortv1.CreatePolicyRequest) {
				r.ClaimChecks = []*cohortv1.ClaimCheck{{Kind: "token_type", Value: strings.Repeat("v", 513)}}
			}), connect.CodeInvalidArgument, "512"},
		} {
			_, err := try(f.client.CreatePolicy, mk, tc.req)
			refusal(t, tc.name, err, tc.code, tc.want)
		}
		if got := snapshot(t, db); got != before {
			t.Fatalf("refusals changed the database: %v → %v", before, got)
		}

		// Claim checks: each kind once, set and removed independently.
		pol := call(t, f.client.CreatePolicy, mk, base(func(r *cohortv1.CreatePolicyRequest) {
			r.Subject, r.Condition = "", `"deploy" in scopes`
			r.ClaimChecks = []*cohortv1.ClaimCheck{{Kind: "scopes", Value: "deploy"}, {Kind: "token_type", Value: "id"}}
		})).GetPolicy()
		if len(pol.GetClaimChecks()) != 2 || !pol.GetEnabled() {
			t.Fatalf("created %v", pol)
		}
		pol = call(t, f.client.RemoveClaimCheck, mk, &cohortv1.RemoveClaimCheckRequest{PolicyId: pol.GetId(), Kind: "scopes"}).GetPolicy()
		if cc := pol.GetClaimChecks(); len(cc) != 1 || cc[0].GetKind() != "token_type" || cc[0].GetValue() != "id" {
			t.Fatalf("after removing scopes: %v", cc)
		}
		_, err := try(f.client.RemoveClaimCheck, mk, &cohortv1.RemoveClaimCheckRequest{PolicyId: pol.GetId(), Kind: "scopes"})
		refusal(t, "remove absent check", err, connect.CodeNotFound, "no scopes claim check")
		pol = call(t, f.client.SetClaimCheck, mk, &cohortv1.SetClaimCheckRequest{PolicyId: pol.GetId(), Check: &cohortv1.ClaimCheck{Kind: "token_type", Value: "access"}}).GetPolicy()
		if cc := pol.GetClaimChecks(); len(cc) != 1 || cc[0].GetValue() != "access" {
			t.Fatalf("after replacing token_type: %v", cc)
		}
		_, err = try(f.client.SetClaimCheck, mk, &cohortv1.SetClaimCheckRequest{PolicyId: pol.GetId(), Check: &cohortv1.ClaimCheck{Kind: "aud", Value: "x"}})
		refusal(t, "set unknown kind", err, connect.CodeInvalidArgument, "scopes or token_type")

		// Update is validated as a whole: clearing the condition of a
		// subject-less policy is refused and changes nothing.
		empty := ""
		_, err = try(f.client.UpdatePolicy, mk, &cohortv1.UpdatePolicyRequest{Id: pol.GetId(), Condition: &empty})
		refusal(t, "update leaving neither", err, connect.CodeInvalidArgument, "subject, a condition, or both")
		if got := call(t, f.client.GetPolicy, mk, &cohortv1.GetPolicyRequest{Id: pol.GetId()}).GetPolicy(); got.GetCondition() == "" {
			t.Fatal("refused update was saved")
		}
		off := false
		pol = call(t, f.client.UpdatePolicy, mk, &cohortv1.UpdatePolicyRequest{Id: pol.GetId(), Enabled: &off, Subject: new("svc")}).GetPolicy()
		if pol.GetEnabled() || pol.GetSubject() != "svc" || pol.GetUpdatedAt() == nil {
			t.Fatalf("update %v", pol)
		}
		_, err = try(f.client.UpdatePolicy, mk, &cohortv1.UpdatePolicyRequest{Id: pol.GetId(), ApiKeyId: &personal})
		refusal(t, "update to a personal key", err, connect.CodeInvalidArgument, "personal")

		// Another organization sees none of it.
		for name, err := range map[string]error{
			"get":    second(try(f.client.GetPolicy, other.managementKey, &cohortv1.GetPolicyRequest{Id: pol.GetId()})),
			"update": second(try(f.client.UpdatePolicy, other.managementKey, &cohortv1.UpdatePolicyRequest{Id: pol.GetId(), Enabled: &off})),
			"delete": second(try(f.client.DeletePolicy, other.managementKey, &cohortv1.DeletePolicyRequest{Id: pol.GetId()})),
			"dryrun": second(try(f.client.DryRun, other.managementKey, &cohortv1.DryRunRequest{PolicyId: pol.GetId(), SubjectToken: "a.b.c"})),
			"issuer": second(try(f.client.DeleteIssuer, other.managementKey, &cohortv1.DeleteIssuerRequest{Id: f.issuerID})),
		} {
			refusal(t, "other organization "+name, err, connect.CodeNotFound, "not found")
		}
		if n := len(call(t, f.client.ListPolicies, other.managementKey, &cohortv1.ListPoliciesRequest{}).GetPolicies()); n != 0 {
			t.Fatalf("other organization lists %d of our policies", n)
		}
		if n := len(call(t, f.client.ListPolicies, mk, &cohortv1.ListPoliciesRequest{IssuerId: f.issuerID}).GetPolicies()); n != 2 {
			t.Fatalf("%d policies of the issuer", n)
		}
		call(t, f.client.DeletePolicy, mk, &cohortv1.DeletePolicyRequest{Id: pol.GetId()})
		_, err = try(f.client.DeletePolicy, mk, &cohortv1.DeletePolicyRequest{Id: pol.GetId()})
		refusal(t, "delete twice", err, connect.CodeNotFound, "not found")
	})
}

// TestSettingsAccess: settings need a management key of an entitled
// organization.
func TestSettingsAccess(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		notEntitled := newOtherOrg(t, f, false)
		for name, key := range map[string]string{"workspace key": f.WorkspaceKey, "personal key": f.NewKey(t, "personal", f.WorkspaceID)} {
			_, err := try(f.client.ListPolicies, key, &cohortv1.ListPoliciesRequest{})
			refusal(t, name, err, connect.CodePermissionDenied, "management key")
		}
		_, err := try(f.client.ListPolicies, "", &cohortv1.ListPoliciesRequest{})
		refusal(t, "no key", err, connect.CodeUnauthenticated, "")
		nk := notEntitled.managementKey
		for name, err := range map[string]error{
			"create issuer": second(try(f.client.CreateIssuer, nk, &cohortv1.CreateIssuerRequest{Name: "x", IssuerUrl: "https://idp.example"})),
			"list issuers":  second(try(f.client.ListIssuers, nk, &cohortv1.ListIssuersRequest{})),
			"list policies": second(try(f.client.ListPolicies, nk, &cohortv1.ListPoliciesRequest{})),
			"validate":      second(try(f.client.ValidateCondition, nk, &cohortv1.ValidateConditionRequest{Condition: "true"})),
			"exchanges":     second(try(f.client.ListExchanges, nk, &cohortv1.ListExchangesRequest{})),
		} {
			refusal(t, "not entitled: "+name, err, connect.CodePermissionDenied, "not enabled for this organization")
		}
		if n := count(t, db, "federation_issuers"); n != 1 {
			t.Fatalf("%d issuers", n)
		}
	})
}

// TestValidateCondition: the save-time rules, each refusal naming its
// rule, and the 2,000-character bound at and past it.
func TestValidateCondition(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		at2000 := `subject == "` + strings.Repeat("a", 2000-len(`subject == ""`)) + `"`
		for _, tc := range []struct {
			name, expr, want string
		}{
			{"plain", `subject == "repo:acme/app"`, ""},
			{"all four variables", `subject.startsWith("repo:") && "cohort" in audience && scopes.exists(s, s == "deploy") && token_type == "id"`, ""},
			{"macros side by side", `scopes.all(s, s != "") && audience.exists(a, a == "x")`, ""},
			{"2000 characters", at2000, ""},
			{"2000 multi-byte characters", `subject == "` + strings.Repeat("é", 2000-len(`subject == ""`)) + `"`, ""},
			{"2001 characters", at2000 + " ", "at most 2000 characters"},
			{"matches method", `subject.matches("^repo:")`, "matches() is not available"},
			{"matches function", `matches(subject, "^repo:")`, "matches() is not available"},
			{"nested comprehension", `scopes.all(s, audience.exists(a, a == s))`, "cannot be nested"},
			{"nested map in filter", `scopes.filter(s, [s].map(x, x).size() > 0).size() > 0`, "cannot be nested"},
			{"not a boolean", `subject`, "must yield a boolean, not string"},
			{"a list", `scopes`, "must yield a boolean"},
			{"unknown variable", `sub == "x"`, "undeclared reference to 'sub'"},
			{"claims map", `claims.sub == "x"`, "undeclared reference to 'claims'"},
			{"type error", `token_type == 1`, "type error"},
			{"syntax", `subject ==`, "syntax error"},
			{"empty", ``, "is empty"},
		} {
			res := call(t, f.client.ValidateCondition, f.ManagementKey, &cohortv1.ValidateConditionRequest{Condition: tc.expr})
			if tc.want == "" {
				if !res.GetValid() {
					t.Errorf("%s: refused: %s", tc.name, res.GetMessage())
				}
				continue
			}
			if res.GetValid() || !strings.Contains(res.GetMessage(), tc.want) {
				t.Errorf("%s: valid=%v %q, want refusal containing %q", tc.name, res.GetValid(), res.GetMessage(), tc.want)
			}
			// Saving a policy with it is refused with the same message.
			_, err := try(f.client.CreatePolicy, f.ManagementKey, &cohortv1.CreatePolicyRequest{IssuerId: f.issuerID, Subject: "s",
				Audience: "a", Condition: tc.expr, ApiKeyId: f.keyID})
			if tc.expr != "" {
				refusal(t, "save "+tc.name, err, connect.CodeInvalidArgument, tc.want)
			}
		}
		if federation.MaxCondition != 2000 {
			t.Fatal("bound changed")
		}
	})
}
