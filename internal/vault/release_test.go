package vault_test

import (
	"context"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/vault"
)

// audit returns the audit rows, oldest first.
func audit(t testing.TB, e *testenv.Env) []store.VaultRelease {
	t.Helper()
	var rows []store.VaultRelease
	if err := e.DB.NewSelect().Model(&rows).Order("created_at", "id").Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	return rows
}

func TestReleaseOnlyToExactHosts(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		const value = "release-me-7f3a"
		mustPut(t, e, e.WorkspaceKey, e.InternID, "api_key", []string{"api.example.com", "bücher.de"}, value, 201)
		v := e.Server.Vault

		for _, host := range []string{"api.example.com", "API.EXAMPLE.COM.", "xn--bcher-kva.de", "BÜCHER.de"} {
			got, err := v.ReleaseSecret(ctx, e.InternID, "api_key", host)
			if err != nil || got != value {
				t.Fatalf("release to %q: %q %v", host, got, err)
			}
		}
		refused := []struct {
			host, name string
			status     int
			reason     apierr.Reason
		}{
			{"example.com", "api_key", 403, "host_not_allowed"},         // parent domain
			{"www.api.example.com", "api_key", 403, "host_not_allowed"}, // subdomain
			{"web.example.com", "api_key", 403, "host_not_allowed"},     // sibling
			{"api.example.com.evil.com", "api_key", 403, "host_not_allowed"},
			{"apiexample.com", "api_key", 403, "host_not_allowed"},
			{"api.example.com:443", "api_key", 400, "bad_request"},
			{"https://api.example.com", "api_key", 400, "bad_request"},
			{"127.0.0.1", "api_key", 400, "bad_request"},
			{"api.example.com", "missing", 404, "not_found"},
			{"api.example.com", "Bad", 400, "bad_request"},
		}
		for _, c := range refused {
			got, err := v.ReleaseSecret(ctx, e.InternID, c.name, c.host)
			if got != "" || !apierr.Is(err, c.status, c.reason) {
				t.Fatalf("release %s to %q: %q %v, want %d %s", c.name, c.host, got, err, c.status, c.reason)
			}
			if strings.Contains(err.Error(), value) {
				t.Fatal("error holds the value")
			}
		}
		// Another intern's secret, a deleted intern, an unknown intern.
		in2 := newIntern(t, e, e.WorkspaceID)
		if _, err := v.ReleaseSecret(ctx, in2, "api_key", "api.example.com"); !apierr.Is(err, 404, "not_found") {
			t.Fatalf("other intern: %v", err)
		}
		if _, err := e.Server.Interns.Delete(ctx, e.Operator(), e.InternID); err != nil {
			t.Fatal(err)
		}
		if _, err := v.ReleaseSecret(ctx, e.InternID, "api_key", "api.example.com"); !apierr.Is(err, 404, "not_found") {
			t.Fatalf("deleted intern: %v", err)
		}

		rows := audit(t, e)
		if len(rows) != 4+len(refused)+2 {
			t.Fatalf("audit rows: %d", len(rows))
		}
		want := []struct{ outcome, reason, host string }{
			{"released", "host_match", "api.example.com"},
			{"released", "host_match", "api.example.com"},
			{"released", "host_match", "xn--bcher-kva.de"},
			{"released", "host_match", "xn--bcher-kva.de"},
			{"refused", "host_not_allowed", "example.com"},
			{"refused", "host_not_allowed", "www.api.example.com"},
			{"refused", "host_not_allowed", "web.example.com"},
			{"refused", "host_not_allowed", "api.example.com.evil.com"},
			{"refused", "host_not_allowed", "apiexample.com"},
			{"refused", "invalid_host", "api.example.com:443"},
			{"refused", "invalid_host", "https://api.example.com"},
			{"refused", "invalid_host", "127.0.0.1"},
			{"refused", "secret_not_found", "api.example.com"},
			{"refused", "invalid_name", "api.example.com"},
			{"refused", "secret_not_found", "api.example.com"},
			{"refused", "intern_not_found", "api.example.com"},
		}
		for i, w := range want {
			r := rows[i]
			if r.Outcome != w.outcome || r.Reason != w.reason || r.Host != w.host || r.Actor != "internal" || r.CreatedAt.IsZero() {
				t.Fatalf("audit[%d] = %+v, want %+v", i, r, w)
			}
		}
		if rows[0].SecretName != "api_key" || rows[0].InternID != e.InternID || rows[0].VaultID == nil || rows[0].OrganizationID == nil || *rows[0].OrganizationID != e.OrganizationID {
			t.Fatalf("audit[0] = %+v", rows[0])
		}
	})
}

func TestReleaseAuditNamesTheCaller(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		mustPut(t, e, e.WorkspaceKey, e.InternID, "api_key", []string{"api.example.com"}, "v", 201)
		ctx := auth.With(context.Background(), &auth.Principal{KeyID: "daemon-key-1", KeyKind: "daemon"})
		if _, err := e.Server.Vault.ReleaseSecret(ctx, e.InternID, "api_key", "api.example.com"); err != nil {
			t.Fatal(err)
		}
		// Hostile input is stored escaped and cut short.
		long := "a\"b\x00" + strings.Repeat("é", 400)
		if _, err := e.Server.Vault.ReleaseSecret(ctx, e.InternID, "api_key", long); err == nil {
			t.Fatal("released to garbage")
		}
		rows := audit(t, e)
		if len(rows) != 2 || rows[0].Actor != "key:daemon-key-1" || rows[1].Reason != "invalid_host" {
			t.Fatalf("audit: %+v", rows)
		}
		if !strings.HasPrefix(rows[1].Host, `"a\"b\x00\u00e9`) || len([]rune(rows[1].Host)) > 1000 {
			t.Fatalf("audit host %q", rows[1].Host)
		}
	})
}

func TestReleaseRefusedWhenOrganizationLeavesProgramme(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		mustPut(t, e, e.WorkspaceKey, e.InternID, "api_key", []string{"api.example.com"}, "v", 201)
		setEntitlements(t, e, false, true)
		if _, err := e.Server.Vault.ReleaseSecret(context.Background(), e.InternID, "api_key", "api.example.com"); !apierr.Is(err, 404, "not_found") {
			t.Fatalf("outside programme: %v", err)
		}
	})
}

// TestTamperingFailsClosed: a changed ciphertext, a ciphertext copied onto
// another name or into another vault, a swapped keyset and hosts changed
// behind the vault's back all refuse the release, and say nothing of why
// to the caller beyond "internal error".
func TestTamperingFailsClosed(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		ctx := context.Background()
		v := e.Server.Vault
		in2 := newIntern(t, e, e.WorkspaceID)
		hosts := []string{"api.example.com"}
		for _, in := range []string{e.InternID, in2} {
			for _, name := range []string{"one", "two"} {
				mustPut(t, e, e.WorkspaceKey, in, name, hosts, "value-of-"+name+"-"+in, 201)
			}
		}
		release := func(in, name string) error {
			got, err := v.ReleaseSecret(ctx, in, name, "api.example.com")
			if err == nil && got != "value-of-"+name+"-"+in {
				t.Fatalf("released %q", got)
			}
			return err
		}
		for _, in := range []string{e.InternID, in2} {
			for _, name := range []string{"one", "two"} {
				if err := release(in, name); err != nil {
					t.Fatalf("untouched %s/%s: %v", in, name, err)
				}
			}
		}
		setCiphertext := func(in, name string, ct []byte) {
			t.Helper()
			row := secretRow(t, e, in, name)
			if _, err := e.DB.NewUpdate().Model((*store.VaultSecret)(nil)).Set("ciphertext = ?", ct).
				Where("vault_id = ? AND name = ?", row.VaultID, name).Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		wantRefused := func(what, in, name string) {
			t.Helper()
			err := release(in, name)
			if !apierr.Is(err, 500, "internal") || apierr.From(err).Message != "internal error" {
				t.Fatalf("%s: %v", what, err)
			}
			rows := audit(t, e)
			if last := rows[len(rows)-1]; last.Outcome != "refused" || last.Reason != "decrypt_failed" {
				t.Fatalf("%s: audit %+v", what, last)
			}
		}

		// One flipped bit.
		orig := secretRow(t, e, e.InternID, "one").Ciphertext
		flipped := append([]byte{}, orig...)
		flipped[len(flipped)/2] ^= 1
		setCiphertext(e.InternID, "one", flipped)
		wantRefused("flipped bit", e.InternID, "one")
		setCiphertext(e.InternID, "one", orig)
		if err := release(e.InternID, "one"); err != nil {
			t.Fatalf("restored: %v", err)
		}

		// Copied onto another name in the same vault.
		setCiphertext(e.InternID, "two", orig)
		wantRefused("copied to another name", e.InternID, "two")

		// Copied into another vault under the same name.
		setCiphertext(in2, "one", orig)
		wantRefused("copied to another vault", in2, "one")

		// Hosts rewritten in the database to send the value elsewhere.
		row := secretRow(t, e, e.InternID, "one")
		if _, err := e.DB.NewUpdate().Model((*store.VaultSecret)(nil)).Set("hosts = ?", `["evil.example.net"]`).
			Where("vault_id = ? AND name = ?", row.VaultID, "one").Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := v.ReleaseSecret(ctx, e.InternID, "one", "evil.example.net"); !apierr.Is(err, 500, "internal") {
			t.Fatalf("rewritten hosts: %v", err)
		}

		// The other vault's keysets swapped into this one.
		va, vb := vaultRow(t, e, e.InternID), vaultRow(t, e, in2)
		if _, err := e.DB.NewUpdate().Model((*store.Vault)(nil)).Set("data_keyset = ?", vb.DataKeyset).Set("mac_keyset = ?", vb.MACKeyset).
			Where("id = ?", va.ID).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		setCiphertext(e.InternID, "two", secretRow(t, e, in2, "two").Ciphertext)
		wantRefused("swapped keysets", e.InternID, "two")
		// Writes into a vault whose keys do not open fail too, and write nothing.
		before := counts(t, e)
		st, body := put(t, e, e.WorkspaceKey, e.InternID, "three", hosts, "v")
		wantError(t, st, body, 500, "")
		if counts(t, e) != before {
			t.Fatal("a failed write stored a row")
		}
		// The other vault is intact.
		if err := release(in2, "two"); err != nil {
			t.Fatalf("other vault: %v", err)
		}
	})
}

func TestStoredCiphertextHoldsNoPlaintext(t *testing.T) {
	t.Parallel()
	testenv.Each(t, func(t *testing.T, e *testenv.Env) {
		value := strings.Repeat("plaintext-marker-", 10)
		mustPut(t, e, e.WorkspaceKey, e.InternID, "api_key", []string{"api.example.com"}, value, 201)
		row := secretRow(t, e, e.InternID, "api_key")
		if strings.Contains(string(row.Ciphertext), "plaintext-marker") {
			t.Fatal("ciphertext holds the plaintext")
		}
		v := vaultRow(t, e, e.InternID)
		if len(v.DataKeyset) == 0 || len(v.MACKeyset) == 0 {
			t.Fatal("vault has no wrapped keys")
		}
		if v.ScopeKind != store.VaultScopeIntern || v.OwnerID != e.InternID || v.OrganizationID != e.OrganizationID {
			t.Fatalf("vault row %+v", v)
		}
		if !strings.HasPrefix(*row.Fingerprint, vault.FingerprintPrefix) {
			t.Fatalf("fingerprint %q", *row.Fingerprint)
		}
	})
}
