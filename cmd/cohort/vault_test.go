package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/bootstrap"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
)

// TestAdminVaultRotateKEK runs the real command against a data directory
// while a "server" (the services over the same database and KEK file) keeps
// using its KEK loaded before the rotation.
func TestAdminVaultRotateKEK(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if err := run(ctx, []string{"migrate", "--data-dir", dir}, &out, &errb); err != nil {
		t.Fatalf("migrate: %v %s", err, errb.String())
	}
	db, err := store.Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := bootstrap.Run(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	kek, err := envelope.LoadOrCreate(filepath.Join(dir, "kek.json"))
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(db, kek, slog.New(slog.NewTextHandler(io.Discard, nil)))
	p, err := srv.Auth.Bearer(ctx, "Bearer "+res.WorkspaceKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Vault.Put(ctx, p, "", &cohortv1.PutInternSecretRequest{InternId: res.InternID, Name: "api_key",
		Hosts: []string{"api.example.com"}, Value: "before rotation"}); err != nil {
		t.Fatal(err)
	}
	before := kek.PrimaryKeyID()

	out.Reset()
	if err := run(ctx, []string{"admin", "vault", "rotate-kek", "--data-dir", dir, "--json"}, &out, &errb); err != nil {
		t.Fatalf("rotate-kek: %v %s", err, errb.String())
	}
	var got struct {
		PrimaryKeyID    uint32 `json:"primary_key_id"`
		VaultsRewrapped string `json:"vaults_rewrapped"` // protojson writes int64 as a string
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	if got.VaultsRewrapped != "1" || got.PrimaryKeyID == 0 || got.PrimaryKeyID == before {
		t.Fatalf("output %q", out.String())
	}
	// The server never restarted and still releases.
	v, err := srv.Vault.ReleaseSecret(ctx, res.InternID, "api_key", "api.example.com")
	if err != nil || v != "before rotation" {
		t.Fatalf("release after rotation: %q %v", v, err)
	}
	if kek.PrimaryKeyID() != got.PrimaryKeyID {
		t.Fatal("the running server did not pick up the new KEK key")
	}

	// An explicit KEK file that does not exist is an error, not a new key.
	err = run(ctx, []string{"admin", "vault", "rotate-kek", "--data-dir", dir, "--kek-file", filepath.Join(dir, "missing.json")}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "no key-encryption key") {
		t.Fatalf("missing KEK file: %v", err)
	}
}

func TestSplitList(t *testing.T) {
	t.Parallel()
	got := splitList(" eu.api.example.com, ,us.api.example.com,")
	if strings.Join(got, "|") != "eu.api.example.com|us.api.example.com" {
		t.Fatalf("%q", got)
	}
	if splitList("") != nil {
		t.Fatal("empty list")
	}
}

// TestAdminVaultAudit lists release decisions of the organization, never
// a value.
func TestAdminVaultAudit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if err := run(ctx, []string{"migrate", "--data-dir", dir}, &out, &errb); err != nil {
		t.Fatalf("migrate: %v %s", err, errb.String())
	}
	db, err := store.Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := bootstrap.Run(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	kek, err := envelope.LoadOrCreate(filepath.Join(dir, "kek.json"))
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(db, kek, slog.New(slog.NewTextHandler(io.Discard, nil)))
	p, _ := srv.Auth.Bearer(ctx, "Bearer "+res.WorkspaceKey)
	if _, err := srv.Vault.Put(ctx, p, "", &cohortv1.PutInternSecretRequest{InternId: res.InternID, Name: "api_key",
		Hosts: []string{"api.example.com"}, Value: "audit-cli-value"}); err != nil {
		t.Fatal(err)
	}
	srv.Vault.ReleaseSecret(ctx, res.InternID, "api_key", "api.example.com")
	srv.Vault.ReleaseSecret(ctx, res.InternID, "api_key", "evil.test")
	out.Reset()
	if err := run(ctx, []string{"admin", "vault", "audit", "--data-dir", dir, "--org", res.OrganizationID, "--id", res.InternID, "--json"}, &out, &errb); err != nil {
		t.Fatalf("audit: %v %s", err, errb.String())
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(rows) != 2 || rows[0]["host"] != "evil.test" || rows[0]["outcome"] != "refused" || rows[1]["reason"] != "host_match" ||
		strings.Contains(out.String(), "audit-cli-value") {
		t.Fatalf("audit: %s", out.String())
	}
	if err := run(ctx, []string{"admin", "vault", "audit", "--data-dir", dir}, &out, &errb); err == nil {
		t.Fatal("audit without --org succeeded")
	}
}
