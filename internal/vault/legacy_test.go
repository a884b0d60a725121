package vault_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/vault"
)

// TestLegacyRowIsReadableNeverReleasedAndRebound: a row written before host
// binding (hosts and fingerprint NULL) fits the schema, reads back with
// null hosts and fingerprint, is never released, and storing the secret
// again assigns hosts and a fingerprint while keeping created_at.
func TestLegacyRowIsReadableNeverReleasedAndRebound(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		mustPut(t, e, e.WorkspaceKey, e.InternID, "current", []string{"api.example.com"}, "v", 201)
		v := vaultRow(t, e, e.InternID)
		created := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
		legacy := &store.VaultSecret{VaultID: v.ID, Name: "old_token", Ciphertext: []byte("written by an earlier version"), CreatedAt: created}
		if _, err := e.DB.NewInsert().Model(legacy).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		var raw struct {
			Hosts       *string `bun:"hosts"`
			Fingerprint *string `bun:"fingerprint"`
		}
		if err := e.DB.NewSelect().TableExpr("vault_secrets").Column("hosts", "fingerprint").Where("name = 'old_token'").Scan(ctx, &raw); err != nil {
			t.Fatal(err)
		}
		if raw.Hosts != nil || raw.Fingerprint != nil {
			t.Fatalf("legacy row is not NULL/NULL: %+v", raw)
		}

		p, err := e.Server.Auth.Bearer(ctx, "Bearer "+e.WorkspaceKey)
		if err != nil {
			t.Fatal(err)
		}
		m, err := e.Server.Vault.Metadata(ctx, p, e.InternID, "old_token")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(vault.ToJSON(m))
		if string(b) != `{"name":"old_token","hosts":null,"fingerprint":null,"created_at":"2025-03-01T12:00:00Z"}` {
			t.Fatalf("legacy metadata: %s", b)
		}
		if _, err := e.Server.Vault.Metadata(ctx, p, e.InternID, "never_stored"); !apierr.Is(err, 404, "not_found") {
			t.Fatalf("missing secret: %v", err)
		}

		// Never released, to any host.
		if _, err := e.Server.Vault.ReleaseSecret(ctx, e.InternID, "old_token", "api.example.com"); !apierr.Is(err, 403, "secret_unbound") {
			t.Fatalf("legacy release: %v", err)
		}
		if rows := audit(t, e); len(rows) != 1 || rows[0].Reason != "unbound" || rows[0].Outcome != "refused" {
			t.Fatalf("audit: %+v", rows)
		}

		// Storing it again binds it: 200 (it existed), hosts and fingerprint set.
		s := mustPut(t, e, e.WorkspaceKey, e.InternID, "old_token", []string{"api.example.com"}, "new value", 200)
		if s.CreatedAt != "2025-03-01T12:00:00Z" || len(s.Hosts) != 1 || s.Fingerprint == nil || !fingerprintRE.MatchString(*s.Fingerprint) {
			t.Fatalf("rebound: %+v", s)
		}
		got, err := e.Server.Vault.ReleaseSecret(ctx, e.InternID, "old_token", "api.example.com")
		if err != nil || got != "new value" {
			t.Fatalf("release after rebinding: %q %v", got, err)
		}
		if counts(t, e) != "vaults=1 vault_secrets=2 vault_releases=2" {
			t.Fatalf("rows: %s", counts(t, e))
		}
		// Reading is allowed while writes are disabled; writing is not.
		setEntitlements(t, e, true, false)
		p, _ = e.Server.Auth.Bearer(ctx, "Bearer "+e.WorkspaceKey)
		if _, err := e.Server.Vault.Metadata(ctx, p, e.InternID, "old_token"); err != nil {
			t.Fatalf("read with writes disabled: %v", err)
		}
	})
}
