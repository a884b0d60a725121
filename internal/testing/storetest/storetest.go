// Package storetest gives tests a migrated, private database: a SQLite file
// in a temporary directory, or a fresh PostgreSQL database created for the
// test and dropped after it. Tests run against the real engines, never a mock.
package storetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
)

// AdminURL is the PostgreSQL server tests create their databases on;
// COHORT_TEST_POSTGRES_URL overrides it.
func AdminURL() string {
	if u := os.Getenv("COHORT_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// SQLite returns a migrated SQLite database in t's temporary directory.
func SQLite(t testing.TB) *bun.DB {
	return SQLiteSync(t, "FULL")
}

// SQLiteSync is SQLite with another synchronous setting (benchmarks).
func SQLiteSync(t testing.TB, synchronous string) *bun.DB {
	db, _ := sqliteAt(t, synchronous)
	return db
}

// SQLiteWithReads is SQLite with a read-only pool beside it, as serve
// opens them.
func SQLiteWithReads(t testing.TB) (*bun.DB, *sql.DB) {
	t.Helper()
	db, path := sqliteAt(t, "FULL")
	reads, err := store.OpenSQLiteReads(context.Background(), path, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reads.Close() })
	return db, reads
}

func sqliteAt(t testing.TB, synchronous string) (*bun.DB, string) {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "cohort.db")
	db, err := store.OpenSQLiteSync(ctx, path, synchronous)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	return db, path
}

var pgOnce struct {
	sync.Once
	err error
}

// PostgresURL creates an empty database for t and returns its URL; the
// database is dropped when t ends. When PostgreSQL is unreachable the test is
// skipped with a loud message, or fails if COHORT_REQUIRE_POSTGRES=1.
func PostgresURL(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	admin, err := sql.Open("pgx", AdminURL())
	if err == nil {
		pgOnce.Do(func() { pgOnce.err = admin.PingContext(ctx) })
		err = pgOnce.err
	}
	if err != nil {
		if admin != nil {
			admin.Close()
		}
		if os.Getenv("COHORT_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("PostgreSQL is required (COHORT_REQUIRE_POSTGRES=1) but unreachable at %s: %v", AdminURL(), err)
		}
		t.Skipf("!!! SKIPPING PostgreSQL test: server unreachable at %s: %v (set COHORT_REQUIRE_POSTGRES=1 to fail instead)", AdminURL(), err)
	}
	defer admin.Close()
	var b [8]byte
	rand.Read(b[:])
	name := "cohort_" + hex.EncodeToString(b[:])
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		a, err := sql.Open("pgx", AdminURL())
		if err != nil {
			return
		}
		defer a.Close()
		a.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u, err := url.Parse(AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// Postgres returns a migrated PostgreSQL database private to t.
func Postgres(t testing.TB) *bun.DB {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, PostgresURL(t), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	return db
}

// Each runs fn as two parallel subtests, one on SQLite and one on PostgreSQL.
func Each(t *testing.T, fn func(t *testing.T, db *bun.DB)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		fn(t, SQLite(t))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, Postgres(t))
	})
}
