package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// adminRun runs `cohort admin args…` in this process and returns stdout,
// stderr and the error.
func adminRun(args ...string) (string, string, error) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), append([]string{"admin"}, args...), &out, &errOut)
	return out.String(), errOut.String(), err
}

// wantCreateHint checks an error says how to make a database.
func wantCreateHint(t *testing.T, err error, names string) {
	t.Helper()
	if err == nil {
		t.Fatal("admin accepted a database that does not exist")
	}
	for _, w := range []string{names, "cohort serve", "cohort migrate", "--init", "nothing was created"} {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not say %q", err, w)
		}
	}
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// Run from the wrong directory, `cohort admin org list` exits 1 naming the
// data directory it looked in, and leaves that directory as it was.
func TestAdminWrongDirectoryProcess(t *testing.T) {
	t.Parallel()
	wd := t.TempDir()
	cmd := exec.Command(os.Args[0], "admin", "org", "list", "--json")
	cmd.Dir = wd
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COHORT_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v (stdout %q, stderr %q)", err, stdout.String(), stderr.String())
	}
	if stdout.Len() != 0 {
		t.Fatalf("printed %q", stdout.String())
	}
	for _, w := range []string{"the directory .cohort does not exist", "--init", "cohort serve"} {
		if !strings.Contains(stderr.String(), w) {
			t.Fatalf("stderr %q does not say %q", stderr.String(), w)
		}
	}
	if n := entries(t, wd); len(n) != 0 {
		t.Fatalf("admin created %v", n)
	}
}

// On SQLite: a missing data directory, an empty one and a file that is no
// Cohort database are refused without a change on disk; --init creates;
// `cohort migrate` makes a database admin then accepts; the flags stand
// before or after the command.
func TestAdminRefusesToCreateSQLite(t *testing.T) {
	t.Parallel()
	typo := filepath.Join(t.TempDir(), "typo")
	_, _, err := adminRun("org", "list", "--data-dir", typo)
	wantCreateHint(t, err, "the directory "+typo+" does not exist (check --data-dir")
	if _, err := os.Stat(typo); !os.IsNotExist(err) {
		t.Fatalf("admin created the data directory: %v", err)
	}

	empty := t.TempDir()
	_, _, err = adminRun("--data-dir", empty, "org", "list")
	wantCreateHint(t, err, "no Cohort database at "+filepath.Join(empty, "cohort.db"))
	if n := entries(t, empty); len(n) != 0 {
		t.Fatalf("admin created %v", n)
	}

	// A URL's file, and the KEK, are not made up either.
	_, _, err = adminRun("org", "list", "--data-dir", empty, "--database-url", "sqlite:"+filepath.Join(empty, "x.db"))
	wantCreateHint(t, err, "(check --database-url")

	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "cohort.db"), nil, 0o600)
	_, _, err = adminRun("org", "list", "--data-dir", other)
	wantCreateHint(t, err, "holds no Cohort database")

	// --init creates the directory and the database.
	dir := filepath.Join(t.TempDir(), "new", "data")
	out, _, err := adminRun("--init", "--data-dir", dir, "org", "list", "--json")
	if err != nil || strings.TrimSpace(out) != "[]" {
		t.Fatalf("--init: %v %q", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "cohort.db")); err != nil {
		t.Fatal(err)
	}
	// Flags after, before, and between the words.
	var org map[string]any
	out, _, err = adminRun("org", "create", "--name", "Acme", "--data-dir", dir, "--json")
	if err != nil || json.Unmarshal([]byte(out), &org) != nil {
		t.Fatalf("flags after: %v %q", err, out)
	}
	for _, args := range [][]string{
		{"--data-dir", dir, "--json", "org", "list"},
		{"--json", "org", "--data-dir", dir, "list"},
		{"org", "list", "--json", "--data-dir=" + dir},
	} {
		out, _, err := adminRun(args...)
		var orgs []map[string]any
		if err != nil || json.Unmarshal([]byte(out), &orgs) != nil || len(orgs) != 1 || orgs[0]["id"] != org["id"] {
			t.Fatalf("%v: %v %q", args, err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "kek.json")); !os.IsNotExist(err) {
		t.Fatalf("admin made a KEK no command needed: %v", err)
	}

	// A database `cohort migrate` made is one admin accepts.
	migrated := t.TempDir()
	if _, err := cli(t, "migrate", "--data-dir", migrated); err != nil {
		t.Fatal(err)
	}
	if out, _, err := adminRun("org", "list", "--data-dir", migrated, "--json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Fatalf("after migrate: %v %q", err, out)
	}

	// A wrong flag gets its error and a pointer, not every command's usage.
	_, stderr, err := adminRun("--data-dri", dir, "org", "list")
	if err == nil || strings.Contains(stderr, "org create") || !strings.Contains(stderr, "cohort admin help") {
		t.Fatalf("bad flag: %v\n%s", err, stderr)
	}
	if _, _, err := adminRun("org", "list", "extra", "--data-dir", dir); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Fatalf("extra word: %v", err)
	}
}

// On PostgreSQL a database without Cohort's schema is refused, named
// without its password, and left without tables; --init migrates it.
func TestAdminRefusesToCreatePostgres(t *testing.T) {
	t.Parallel()
	url := storetest.PostgresURL(t)
	dataDir := filepath.Join(t.TempDir(), "absent")
	_, _, err := adminRun("org", "list", "--database-url", url, "--data-dir", dataDir)
	wantCreateHint(t, err, "holds no Cohort database")
	if !strings.Contains(err.Error(), "the PostgreSQL database \"cohort_") {
		t.Fatalf("error does not name the database: %v", err)
	}
	tables := func() int {
		t.Helper()
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var n int
		if err := db.QueryRow("SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := tables(); n != 0 {
		t.Fatalf("admin created %d tables", n)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("admin created the data directory: %v", err)
	}
	if out, _, err := adminRun("--database-url", url, "--init", "org", "list", "--json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Fatalf("--init: %v %q", err, out)
	}
	if tables() == 0 {
		t.Fatal("--init migrated nothing")
	}
	if out, _, err := adminRun("--database-url", url, "org", "list", "--json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Fatalf("after --init: %v %q", err, out)
	}
}
