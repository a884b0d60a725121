package federation_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/federation"
	"github.com/cohort-dev/cohort/internal/store"
)

// TestPolicyChangesReachTheNextExchange: the gateway keeps policies in
// memory, so every input of a policy is changed here behind its back, in
// plain SQL (as another replica, the operator's CLI or an administrator
// would), right after an exchange that cached it. The very next exchange
// must see the change; undoing it must let exchanges through again.
func TestPolicyChangesReachTheNextExchange(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *bun.DB, p *idp) {
		f := newFed(t, db, p)
		ctx := context.Background()
		exec := func(q string, args ...any) {
			t.Helper()
			if _, err := db.ExecContext(ctx, q, args...); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		tok := p.token(t, kidRSA, p.claims())
		var pol store.FederationPolicy
		if err := db.NewSelect().Model(&pol).Where("id = ?", f.policyID).Scan(ctx); err != nil {
			t.Fatal(err)
		}
		refusedBy := func(check string) {
			t.Helper()
			expectError(t, f.exchange(t, tok), http.StatusBadRequest, federation.ReasonInvalidGrant)
			if check == "" {
				return
			}
			// From the table: the audit RPC needs the entitlement that
			// one of the changes takes away.
			f.Server.Federation.FlushAudit(ctx)
			var last store.FederationExchange
			if err := db.NewSelect().Model(&last).OrderExpr("at DESC, id DESC").Limit(1).Scan(ctx); err != nil {
				t.Fatal(err)
			}
			if last.FailedCheck != check {
				t.Fatalf("refused by %q, want %q", last.FailedCheck, check)
			}
		}
		now := time.Now()
		for _, c := range []struct {
			name         string
			change, undo func()
			check        string
		}{
			{"policy paused",
				func() { exec("UPDATE federation_policies SET enabled = ? WHERE id = ?", false, f.policyID) },
				func() { exec("UPDATE federation_policies SET enabled = ? WHERE id = ?", true, f.policyID) },
				"policy_enabled"},
			{"policy subject",
				func() { exec("UPDATE federation_policies SET subject = ? WHERE id = ?", "repo:other", f.policyID) },
				func() { exec("UPDATE federation_policies SET subject = ? WHERE id = ?", pol.Subject, f.policyID) },
				"subject"},
			{"policy condition",
				func() { exec("UPDATE federation_policies SET condition_expr = ? WHERE id = ?", "false", f.policyID) },
				func() { exec("UPDATE federation_policies SET condition_expr = ? WHERE id = ?", "", f.policyID) },
				"condition"},
			{"issuer URL",
				func() {
					exec("UPDATE federation_issuers SET issuer_url = ? WHERE id = ?", "https://other.example", f.issuerID)
				},
				func() { exec("UPDATE federation_issuers SET issuer_url = ? WHERE id = ?", p.URL, f.issuerID) },
				"issuer"},
			{"entitlement",
				func() { exec("UPDATE organizations SET workload_identity = ? WHERE id = ?", false, pol.OrganizationID) },
				func() { exec("UPDATE organizations SET workload_identity = ? WHERE id = ?", true, pol.OrganizationID) },
				"entitlement"},
			{"key disabled",
				func() { exec("UPDATE api_keys SET disabled_at = ? WHERE id = ?", now, f.keyID) },
				func() { exec("UPDATE api_keys SET disabled_at = NULL WHERE id = ?", f.keyID) },
				"api_key"},
			{"key deleted",
				func() { exec("UPDATE api_keys SET deleted_at = ? WHERE id = ?", now, f.keyID) },
				func() { exec("UPDATE api_keys SET deleted_at = NULL WHERE id = ?", f.keyID) },
				"api_key"},
			{"key kind",
				func() { exec("UPDATE api_keys SET kind = ? WHERE id = ?", "management", f.keyID) },
				func() { exec("UPDATE api_keys SET kind = ? WHERE id = ?", store.KeyWorkspace, f.keyID) },
				"api_key"},
			{"policy deleted",
				func() { exec("DELETE FROM federation_policies WHERE id = ?", f.policyID) },
				func() {
					if _, err := db.NewInsert().Model(&pol).Exec(ctx); err != nil {
						t.Fatal(err)
					}
				},
				""},
			// Deleted and inserted again under the same id, with another
			// subject, between two exchanges (a restore): the row's new
			// version is not the one in memory.
			{"policy replaced",
				func() {
					exec("DELETE FROM federation_policies WHERE id = ?", f.policyID)
					other := pol
					other.Subject = "repo:other"
					if _, err := db.NewInsert().Model(&other).Exec(ctx); err != nil {
						t.Fatal(err)
					}
				},
				func() {
					exec("DELETE FROM federation_policies WHERE id = ?", f.policyID)
					if _, err := db.NewInsert().Model(&pol).Exec(ctx); err != nil {
						t.Fatal(err)
					}
				},
				"subject"},
		} {
			issued(t, f.exchange(t, tok)) // the policy is in memory now
			c.change()
			refusedBy(c.check)
			refusedBy(c.check) // and stays refused from memory
			c.undo()
			issued(t, f.exchange(t, tok))
			if t.Failed() {
				t.Fatalf("after %s", c.name)
			}
		}
	})
}
