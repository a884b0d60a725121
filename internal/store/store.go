// Package store opens Cohort's database (SQLite by default, PostgreSQL for
// scale), runs its migrations, and defines the rows that domain packages read
// and write with bun. It knows no business rules.
package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" driver
)

// Open connects to databaseURL, or when it is empty to the embedded SQLite
// file cohort.db in dataDir (created if missing). It does not migrate.
func Open(ctx context.Context, databaseURL, dataDir string) (*bun.DB, error) {
	if IsPostgres(databaseURL) {
		cfg, err := pgx.ParseConfig(databaseURL)
		if err != nil {
			return nil, fmt.Errorf("open postgres: %w", err)
		}
		sqldb := sql.OpenDB(retryConnector{stdlib.GetConnector(*cfg)})
		sqldb.SetMaxOpenConns(32)
		sqldb.SetMaxIdleConns(32)
		db := bun.NewDB(sqldb, pgdialect.New())
		if err := db.PingContext(ctx); err != nil {
			db.Close()
			return nil, fmt.Errorf("connect to postgres: %w", err)
		}
		return db, nil
	}
	if databaseURL != "" && !strings.HasPrefix(databaseURL, "sqlite:") {
		return nil, fmt.Errorf("database url: want postgres://… or sqlite:PATH, got scheme %q", scheme(databaseURL))
	}
	path, _ := SQLiteFile(databaseURL, dataDir)
	if strings.TrimPrefix(databaseURL, "sqlite:") == "" {
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return nil, fmt.Errorf("create data directory: %w", err)
		}
	}
	return OpenSQLite(ctx, path)
}

// SQLiteFile is the SQLite file Open uses for databaseURL, and whether it
// is one (not PostgreSQL, not in memory).
func SQLiteFile(databaseURL, dataDir string) (string, bool) {
	if IsPostgres(databaseURL) {
		return "", false
	}
	path := strings.TrimPrefix(databaseURL, "sqlite:")
	if path == "" {
		path = filepath.Join(dataDir, "cohort.db")
	}
	return path, path != ":memory:" && !strings.Contains(path, "mode=memory")
}

// OpenSQLite opens (creating) the SQLite database file at path with WAL,
// foreign keys, a busy timeout and synchronous=FULL: a write the service
// acknowledged (a vault secret "stored") survives a power loss, which
// NORMAL does not promise in WAL mode (docs/benchmarks.md has the cost).
func OpenSQLite(ctx context.Context, path string) (*bun.DB, error) {
	return OpenSQLiteSync(ctx, path, "FULL")
}

// OpenSQLiteSync is OpenSQLite with another synchronous setting (NORMAL,
// for the benchmark that measures what FULL costs).
func OpenSQLiteSync(ctx context.Context, path, synchronous string) (*bun.DB, error) {
	// The database holds key hashes and wrapped keys: owner-only.
	if f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600); err == nil {
		f.Close()
	}
	// Switching a new file to WAL takes an exclusive lock for which SQLite
	// may answer SQLITE_BUSY at once instead of waiting (two processes
	// opening the same new database). Opening under the migrations' file
	// lock makes the second opener wait for the first.
	if path != ":memory:" {
		unlock, err := lockFile(ctx, path+".migrate-lock")
		if err != nil {
			return nil, fmt.Errorf("open sqlite %s: lock: %w", path, err)
		}
		defer unlock()
	}
	// Write transactions begin IMMEDIATE: another process on the same file
	// (a second gateway, `cohort` commands, tests) makes a deferred
	// transaction that read first fail at its first write with SQLITE_BUSY
	// at once (its snapshot is stale; the busy handler is not consulted).
	// Taking the write lock at BEGIN waits in the busy handler instead.
	dsn := "file:" + path + "?_pragma=foreign_keys(1)&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(" + synchronous + ")&_txlock=immediate"
	sqldb, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	// SQLite has one writer at a time. One connection serialises writers in
	// Go instead of in SQLite's busy handler, which sleeps and retries.
	sqldb.SetMaxOpenConns(1)
	db := bun.NewDB(sqldb, sqlitedialect.New())
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	return db, nil
}

// OpenSQLiteReads opens a pool of read-only connections to the SQLite
// database at path (already opened, in WAL mode, by OpenSQLite): WAL lets
// readers run beside each other and beside the one writer, so hot read
// paths (the token exchange's policy lookup) scale with cores instead of
// queueing on the writer's single connection.
func OpenSQLiteReads(ctx context.Context, path string, conns int) (*sql.DB, error) {
	dsn := "file:" + path + "?_pragma=busy_timeout(5000)&_pragma=query_only(1)"
	sqldb, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sqlite reads: %w", err)
	}
	sqldb.SetMaxOpenConns(conns)
	sqldb.SetMaxIdleConns(conns)
	if err := sqldb.PingContext(ctx); err != nil {
		sqldb.Close()
		return nil, fmt.Errorf("open sqlite reads %s: %w", path, err)
	}
	return sqldb, nil
}

// IsPostgres reports whether url names a PostgreSQL database.
func IsPostgres(url string) bool {
	return strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://")
}

func scheme(url string) string {
	if i := strings.Index(url, ":"); i > 0 {
		return url[:i]
	}
	return url
}

// IsUniqueViolation reports whether err is a unique-constraint violation on
// either database.
func IsUniqueViolation(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	return strings.Contains(s, "UNIQUE constraint failed") || strings.Contains(s, "SQLSTATE 23505")
}

// Now returns clock() (or the wall clock when nil) in UTC, truncated to the
// microsecond both databases keep, so what a create returns equals what a
// later read returns.
func Now(clock func() time.Time) time.Time {
	t := time.Now()
	if clock != nil {
		t = clock()
	}
	return t.UTC().Truncate(time.Microsecond)
}
