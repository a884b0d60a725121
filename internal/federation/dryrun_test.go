package federation_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/federation"
)

func TestDryRun(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		mk := f.ManagementKey
		dry := func(token string) *cohortv1.DryRunResponse {
			return call(t, f.client.DryRun, mk, &cohortv1.DryRunRequest{PolicyId: f.policyID, SubjectToken: token})
		}
		outcomes := func(r *cohortv1.DryRunResponse) string {
			var b strings.Builder
			for _, s := range r.GetSteps() {
				b.WriteString(s.GetCheck() + ":" + s.GetOutcome() + " ")
			}
			return strings.TrimSpace(b.String())
		}
		good := p.token(t, kidRSA, p.claims())
		r := dry(good)
		if !r.GetWouldIssue() || r.GetFailedCheck() != "" {
			t.Fatalf("good token: %v", r)
		}
		want := "token_format:passed policy:passed entitlement:passed policy_enabled:passed token_limits:passed algorithm:passed " +
			"issuer_keys:passed signature:passed expiry:passed issuer:passed audience:passed subject:passed claim_scopes:passed " +
			"claim_token_type:passed condition:passed api_key:passed"
		if got := outcomes(r); got != want {
			t.Fatalf("steps\n got %s\nwant %s", got, want)
		}

		c := p.claims()
		c["aud"] = []string{"other"}
		r = dry(p.token(t, kidRSA, c))
		if r.GetWouldIssue() || r.GetFailedCheck() != "audience" {
			t.Fatalf("wrong audience: %v", r)
		}
		if !strings.Contains(outcomes(r), "audience:failed subject:not_run claim_scopes:not_run claim_token_type:not_run condition:not_run api_key:not_run") {
			t.Fatalf("steps after the failure: %s", outcomes(r))
		}
		if d := r.GetSteps()[10].GetDetail(); !strings.Contains(d, `"cohort"`) {
			t.Fatalf("detail %q", d)
		}
		r = dry("not a jwt")
		if r.GetFailedCheck() != "token_format" || len(r.GetSteps()) != 16 {
			t.Fatalf("not a JWT: %v", r)
		}
		c = p.claims()
		c["exp"] = time.Now().Unix() - 10
		if r = dry(p.token(t, kidRSA, c)); r.GetFailedCheck() != "expiry" {
			t.Fatalf("expired: %v", r)
		}
		// Past the 16 KB bound: refused as a bad request, cheaply.
		_, err := try(f.client.DryRun, mk, &cohortv1.DryRunRequest{PolicyId: f.policyID, SubjectToken: strings.Repeat(".", 20<<10)})
		refusal(t, "20 KB of dots", err, connect.CodeInvalidArgument, "16384")
		// Past the service's body bound (64 KiB): refused before it is decoded.
		_, err = try(f.client.DryRun, mk, &cohortv1.DryRunRequest{PolicyId: f.policyID, SubjectToken: strings.Repeat(".", 1<<20)})
		refusal(t, "1 MB of dots", err, connect.CodeResourceExhausted, "65536")
		_, err = try(f.client.DryRun, mk, &cohortv1.DryRunRequest{PolicyId: "nope", SubjectToken: good})
		refusal(t, "unknown policy", err, connect.CodeNotFound, "not found")
		_, err = try(f.client.DryRun, f.WorkspaceKey, &cohortv1.DryRunRequest{PolicyId: f.policyID, SubjectToken: good})
		refusal(t, "workspace key", err, connect.CodePermissionDenied, "management key")

		// A dry run is not an exchange: no audit row, no token; and the
		// pasted token is not logged.
		f.Server.Federation.FlushAudit(context.Background())
		if n := count(t, db, "federation_exchanges"); n != 0 {
			t.Fatalf("dry runs wrote %d audit rows", n)
		}
		sig := good[strings.LastIndex(good, ".")+1:]
		if strings.Contains(f.Logs(), sig) {
			t.Fatal("the pasted token reached the log")
		}
		_ = federation.MaxSubjectToken
	})
}
