package federation_test

import (
	"strings"
	"testing"
	"time"

	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
)

// TestSubjectTokenBounds: each bound of the Limits table at the bound
// (accepted) and one past it (invalid_grant, audited as token_limits).
func TestSubjectTokenBounds(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		aud512 := strings.Repeat("a", 512)
		pol := call(t, f.client.CreatePolicy, f.ManagementKey, &cohortv1.CreatePolicyRequest{IssuerId: f.issuerID,
			Condition: `size(subject) >= 1`, Audience: aud512, ApiKeyId: f.keyID}).GetPolicy().GetId()
		tok := func(change func(c map[string]any)) string {
			c := p.claims()
			c["aud"] = aud512
			change(c)
			return p.token(t, kidRSA, c)
		}
		scopes := func(n, length int) []string {
			out := make([]string, n)
			for i := range out {
				out[i] = strings.Repeat("s", length)
			}
			return out
		}
		// A multi-byte sub counts characters, not bytes.
		for _, tc := range []struct {
			name string
			tok  string
			ok   bool
		}{
			{"sub 512", tok(func(c map[string]any) { c["sub"] = strings.Repeat("x", 512) }), true},
			{"sub 513", tok(func(c map[string]any) { c["sub"] = strings.Repeat("x", 513) }), false},
			{"sub 512 multi-byte characters", tok(func(c map[string]any) { c["sub"] = strings.Repeat("é", 512) }), true},
			{"aud 512 (string)", tok(func(c map[string]any) {}), true},
			{"aud 512 (array)", tok(func(c map[string]any) { c["aud"] = []string{"x", aud512} }), true},
			{"aud 513 in the array", tok(func(c map[string]any) { c["aud"] = []string{aud512, aud512 + "b"} }), false},
			{"16 scopes of 512", tok(func(c map[string]any) { c["scopes"] = scopes(16, 512) }), true},
			{"17 scopes", tok(func(c map[string]any) { c["scopes"] = scopes(17, 1) }), false},
			{"a scope of 513", tok(func(c map[string]any) { c["scopes"] = append(scopes(15, 1), strings.Repeat("s", 513)) }), false},
		} {
			a := f.post(t, exchangeForm(tc.tok, pol))
			if tc.ok {
				issued(t, a)
			} else {
				expectError(t, a, 400, "invalid_grant")
				rows := f.audit(t)
				if rows[0].GetFailedCheck() != "token_limits" {
					t.Errorf("%s: audited as %q (%s), want token_limits", tc.name, rows[0].GetFailedCheck(), rows[0].GetDetail())
				}
			}
		}
	})
}

// TestClaimShapes: real-world token shapes pass their policies, and the
// exact checks and the CEL input read the same decoded claims.
func TestClaimShapes(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		now := time.Now().Unix()
		mk := f.ManagementKey
		create := func(req *cohortv1.CreatePolicyRequest) string {
			req.IssuerId, req.ApiKeyId = f.issuerID, f.keyID
			return call(t, f.client.CreatePolicy, mk, req).GetPolicy().GetId()
		}

		// GitHub Actions: string ids, a repo: subject, many extra claims.
		gha := create(&cohortv1.CreatePolicyRequest{Audience: "https://github.com/acme",
			Condition: `subject.startsWith("repo:acme/deploy:") && subject.endsWith(":environment:production")`})
		ghaClaims := map[string]any{
			"jti": "8d2b6c8e-1f0b-4c43-9c3f-1b2b3c4d5e6f", "sub": "repo:acme/deploy:environment:production",
			"environment": "production", "aud": "https://github.com/acme", "ref": "refs/heads/main",
			"sha": "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", "repository": "acme/deploy", "repository_owner": "acme",
			"repository_owner_id": "1234567", "repository_id": "76543210", "repository_visibility": "private",
			"run_id": "5821234567", "run_number": "42", "run_attempt": "1", "actor": "octocat", "actor_id": "583231",
			"workflow": "deploy", "event_name": "push", "ref_type": "branch", "job_workflow_ref": "acme/deploy/.github/workflows/deploy.yml@refs/heads/main",
			"runner_environment": "github-hosted", "iss": p.URL, "nbf": now - 5, "exp": now + 300, "iat": now,
		}
		tok, n := issued(t, f.post(t, exchangeForm(p.token(t, kidRSA, ghaClaims), gha)))
		if n < 290 || n > 300 {
			t.Fatalf("GitHub token with 300 s left: expires_in %d", n)
		}
		if c := verifyIssued(t, f, tok); c["sub"] != ghaClaims["sub"] {
			t.Fatalf("sub %v", c["sub"])
		}
		ghaClaims["sub"] = "repo:acme/deploy:environment:staging"
		expectError(t, f.post(t, exchangeForm(p.token(t, kidRSA, ghaClaims), gha)), 400, "invalid_grant")

		// Kubernetes service account: an array aud, nested claims, ES256.
		k8s := create(&cohortv1.CreatePolicyRequest{Subject: "system:serviceaccount:prod:inference", Audience: "cohort",
			Condition: `audience.exists(a, a == "https://kubernetes.default.svc") && size(audience) == 2`})
		k8sClaims := map[string]any{
			"aud": []string{"cohort", "https://kubernetes.default.svc"}, "exp": now + 3600, "iat": now, "nbf": now,
			"iss": p.URL, "sub": "system:serviceaccount:prod:inference", "jti": "c8c2a5f4",
			"kubernetes.io": map[string]any{"namespace": "prod",
				"pod":            map[string]any{"name": "inference-7d9f", "uid": "1a2b"},
				"serviceaccount": map[string]any{"name": "inference", "uid": "3c4d"}, "warnafter": now + 3000},
		}
		issued(t, f.post(t, exchangeForm(p.token(t, kidEC, k8sClaims), k8s)))

		// Case-variant duplicates: encoding/json would match SUB to a
		// field named Sub; we decode once into a map, so "sub" is sub and
		// the condition sees the same value as the exact check.
		variant := create(&cohortv1.CreatePolicyRequest{Subject: "repo:acme/app", Audience: "cohort", Condition: `subject == "repo:acme/app"`})
		raw := func(payload string) string {
			return sign(t, `{"alg":"RS256","kid":"rsa-1"}`, payload, rsaKey)
		}
		tail := `,"iss":"` + p.URL + `","aud":"cohort","exp":` + itoa(now+600) + `}`
		tok, _ = issued(t, f.post(t, exchangeForm(raw(`{"sub":"repo:acme/app","SUB":"repo:evil/app","Sub":"repo:evil/app"`+tail), variant)))
		if c := verifyIssued(t, f, tok); c["sub"] != "repo:acme/app" {
			t.Fatalf("issued sub %v", c["sub"])
		}
		expectError(t, f.post(t, exchangeForm(raw(`{"SUB":"repo:acme/app","sub":"repo:evil/app"`+tail), variant)), 400, "invalid_grant")
		expectError(t, f.post(t, exchangeForm(raw(`{"SUB":"repo:acme/app"`+tail), variant)), 400, "invalid_grant")
		// A condition-only policy where only the CEL input could be fooled.
		condOnly := create(&cohortv1.CreatePolicyRequest{Audience: "cohort", Condition: `subject == "repo:acme/app"`})
		expectError(t, f.post(t, exchangeForm(raw(`{"Sub":"repo:acme/app","sub":"repo:evil"`+tail), condOnly)), 400, "invalid_grant")
		issued(t, f.post(t, exchangeForm(raw(`{"sub":"repo:acme/app","SUB":"x"`+tail), condOnly)))

		// A scopes claim and a token_type claim satisfy their checks and
		// feed the condition.
		both := create(&cohortv1.CreatePolicyRequest{Subject: "svc", Audience: "cohort", Condition: `token_type == "id" && scopes.all(s, s.size() < 10)`,
			ClaimChecks: []*cohortv1.ClaimCheck{{Kind: "scopes", Value: "deploy"}, {Kind: "token_type", Value: "id"}}})
		c := p.claims()
		c["sub"], c["scopes"], c["token_type"] = "svc", []string{"read", "deploy"}, "id"
		issued(t, f.post(t, exchangeForm(p.token(t, kidRSA, c), both)))
		// A wrongly typed claim the condition does not read is not its
		// concern: the policy without checks or a scopes-reading condition
		// accepts a token whose scopes is a string.
		c = p.claims()
		c["scopes"] = "read deploy"
		issued(t, f.exchange(t, p.token(t, kidRSA, c)))
	})
}

func itoa(n int64) string {
	b := []byte{}
	if n == 0 {
		return "0"
	}
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}
