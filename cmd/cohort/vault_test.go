package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/bootstrap"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// vaultServer is a data directory, migrated and bootstrapped, with "a
// server" over it (the services over the same database and KEK file) and
// the principal of its workspace key.
func vaultServer(t *testing.T) (string, *bootstrap.Result, *envelope.KEK, *server.Server, *auth.Principal) {
	t.Helper()
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
	t.Cleanup(func() { db.Close() })
	res, err := bootstrap.Run(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	kek, err := envelope.LoadOrCreate(filepath.Join(dir, "kek.json"))
	if err != nil {
		t.Fatal(err)
	}
	srv := testenv.Server(t, db, kek)
	p, err := srv.Auth.Bearer(ctx, "Bearer "+res.WorkspaceKey)
	if err != nil {
		t.Fatal(err)
	}
	return dir, res, kek, srv, p
}

// TestAdminVaultRotateKEK runs the real command against a data directory
// while a "server" (the services over the same database and KEK file) keeps
// using its KEK loaded before the rotation.
func TestAdminVaultRotateKEK(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, res, kek, srv, p := vaultServer(t)
	var out, errb bytes.Buffer
	if _, err := srv.Vault.Put(ctx, p, &cohortv1.PutInternSecretRequest{InternId: res.InternID, Name: "api_key",
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
	srv := testenv.Server(t, db, kek)
	p, _ := srv.Auth.Bearer(ctx, "Bearer "+res.WorkspaceKey)
	if _, err := srv.Vault.Put(ctx, p, &cohortv1.PutInternSecretRequest{InternId: res.InternID, Name: "api_key",
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

// Many rotate-kek processes at once, and one killed with SIGKILL midway:
// every admin command waits for the others (migrations, the KEK file) and
// succeeds, no key is dropped, every secret still opens, and the next
// rotation works.
func TestConcurrentRotateKEKAndACrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, res, _, srv, p := vaultServer(t)
	// Secrets in the intern's vault and the workspace's.
	for i := range 5 {
		if _, err := srv.Vault.Put(ctx, p, &cohortv1.PutInternSecretRequest{InternId: res.InternID, Name: fmt.Sprintf("k%d", i),
			Hosts: []string{"api.example.com"}, Value: fmt.Sprintf("value-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rotate := func() *exec.Cmd {
		c := exec.Command(self, "admin", "vault", "rotate-kek", "--data-dir", dir, "--json")
		c.Env = cleanAdminEnv()
		return c
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b, err := rotate().CombinedOutput(); err != nil {
				errs <- fmt.Sprintf("%v: %s", err, b)
			}
		}()
	}
	// One more, killed mid-way.
	victim := rotate()
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	victim.Process.Kill()
	victim.Wait()
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("a concurrent rotation failed: %s", e)
	}

	// The next rotation works (it re-wraps, so opens, every vault) ...
	if b, err := rotate().CombinedOutput(); err != nil {
		t.Fatalf("rotation after the crash: %v %s", err, b)
	}
	// ... and the server, never restarted, releases every value.
	for i := range 5 {
		v, err := srv.Vault.ReleaseSecret(ctx, res.InternID, fmt.Sprintf("k%d", i), "api.example.com")
		if err != nil || v != fmt.Sprintf("value-%d", i) {
			t.Fatalf("release k%d: %q %v", i, v, err)
		}
	}
	if _, err := srv.Vault.Put(ctx, p, &cohortv1.PutInternSecretRequest{InternId: res.InternID, Name: "after",
		Hosts: []string{"api.example.com"}, Value: "x"}); err != nil {
		t.Fatalf("put after rotations: %v", err)
	}
}

// cleanAdminEnv is the environment without COHORT_* settings.
func cleanAdminEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COHORT_") {
			out = append(out, kv)
		}
	}
	return out
}
