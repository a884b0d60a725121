package vault_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/tink-crypto/tink-go/v2/insecurecleartextkeyset"
	"github.com/tink-crypto/tink-go/v2/keyset"
	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/vault"
)

// wrappedUnder returns the id of the KEK key a wrapped keyset was wrapped
// with (Tink's 5-byte ciphertext prefix: 0x01 and the key id).
func wrappedUnder(t *testing.T, wrapped []byte) uint32 {
	t.Helper()
	ek, err := keyset.NewBinaryReader(bytes.NewReader(wrapped)).ReadEncrypted()
	if err != nil {
		t.Fatal(err)
	}
	ct := ek.GetEncryptedKeyset()
	if len(ct) < 5 || ct[0] != 1 {
		t.Fatalf("not a Tink-prefixed ciphertext")
	}
	return binary.BigEndian.Uint32(ct[1:5])
}

// TestRotateKEK: RewrapAll re-wraps every vault's keys under the new
// primary KEK key without touching a ciphertext; a server that keeps
// running on the old KEK file handle goes on reading and writing; and after
// the re-wrap the old KEK key is no longer needed at all.
func TestRotateKEK(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		dir := t.TempDir()
		path := filepath.Join(dir, "kek.json")
		running, err := envelope.LoadOrCreate(path)
		if err != nil {
			t.Fatal(err)
		}
		e := testenv.New(t, db, func(s *server.Server) { s.KEK, s.Vault.KEK = running, running })
		in2 := newIntern(t, e, e.WorkspaceID)
		interns := []string{e.InternID, in2}
		fps := map[string]string{}
		for _, in := range interns {
			fps[in] = *mustPut(t, e, e.WorkspaceKey, in, "api_key", []string{"api.example.com"}, "value-"+in, 201).Fingerprint
			if _, err := e.Server.Vault.ReleaseSecret(ctx, in, "api_key", "api.example.com"); err != nil {
				t.Fatal(err)
			}
		}
		ca, err := vault.LoadProxyCA(ctx, db, running, nil)
		if err != nil {
			t.Fatal(err)
		}
		oldKey := running.PrimaryKeyID()
		before := map[string]store.Vault{}
		cts := map[string][]byte{}
		for _, in := range interns {
			before[in] = vaultRow(t, e, in)
			cts[in] = secretRow(t, e, in, "api_key").Ciphertext
			if wrappedUnder(t, before[in].DataKeyset) != oldKey {
				t.Fatal("vault not wrapped under the KEK's primary key")
			}
		}

		// What `cohort admin vault rotate-kek` does: rotate the file, load
		// it afresh, re-wrap.
		newKey, err := envelope.Rotate(path)
		if err != nil {
			t.Fatal(err)
		}
		cli, err := envelope.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		n, err := (&vault.Service{DB: db, KEK: cli}).RewrapAll(ctx)
		if err != nil || n != 2 {
			t.Fatalf("rewrapped %d: %v", n, err)
		}
		for _, in := range interns {
			after := vaultRow(t, e, in)
			if bytes.Equal(after.DataKeyset, before[in].DataKeyset) || bytes.Equal(after.MACKeyset, before[in].MACKeyset) {
				t.Fatal("keysets not re-wrapped")
			}
			if wrappedUnder(t, after.DataKeyset) != newKey || wrappedUnder(t, after.MACKeyset) != newKey {
				t.Fatal("keysets not wrapped under the new primary key")
			}
			if after.RewrappedAt == nil {
				t.Fatal("rewrapped_at not set")
			}
			if !bytes.Equal(secretRow(t, e, in, "api_key").Ciphertext, cts[in]) {
				t.Fatal("a ciphertext changed")
			}
		}

		// The running server, which loaded the file before the rotation,
		// still releases and writes; the fingerprint is the same.
		for _, in := range interns {
			if got, err := e.Server.Vault.ReleaseSecret(ctx, in, "api_key", "api.example.com"); err != nil || got != "value-"+in {
				t.Fatalf("release after rotation: %q %v", got, err)
			}
			s := mustPut(t, e, e.WorkspaceKey, in, "api_key", []string{"api.example.com"}, "value-"+in, 200)
			if *s.Fingerprint != fps[in] {
				t.Fatal("fingerprint changed across a KEK rotation")
			}
		}

		// A KEK file holding only the new key opens everything.
		h, err := insecurecleartextkeyset.Read(keyset.NewJSONReader(mustOpen(t, path)))
		if err != nil {
			t.Fatal(err)
		}
		m := keyset.NewManagerFromHandle(h)
		if err := m.Delete(oldKey); err != nil {
			t.Fatal(err)
		}
		nh, err := m.Handle()
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := insecurecleartextkeyset.Write(nh, keyset.NewJSONWriter(&buf)); err != nil {
			t.Fatal(err)
		}
		onlyNew := filepath.Join(dir, "only-new.json")
		if err := os.WriteFile(onlyNew, buf.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		kek, err := envelope.Load(onlyNew)
		if err != nil {
			t.Fatal(err)
		}
		fresh := &vault.Service{DB: db, KEK: kek, Interns: e.Server.Interns}
		for _, in := range interns {
			if got, err := fresh.ReleaseSecret(ctx, in, "api_key", "api.example.com"); err != nil || got != "value-"+in {
				t.Fatalf("release with only the new KEK key: %q %v", got, err)
			}
		}
		// The proxy CA's key was re-wrapped too: the same CA opens.
		if again, err := vault.LoadProxyCA(ctx, db, kek, nil); err != nil || again.CertPEM() != ca.CertPEM() {
			t.Fatalf("the proxy CA with only the new KEK key: %v", err)
		}
		// The old wrapping needed the old key: proof the check above means something.
		if _, err := vault.OpenKeyring(kek, ptr(before[e.InternID])); err == nil {
			t.Fatal("old wrapping opened without the old key")
		}
	})
}

func ptr[T any](v T) *T { return &v }

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
