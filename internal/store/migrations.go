package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
	"github.com/uptrace/bun/migrate"
)

// Migrations are Go-defined and run unchanged on SQLite and PostgreSQL. Each
// lives in its own file named NNNNNNNNNNNNNN_name.go (bun takes its name from
// the file) and writes its DDL out rather than deriving it from the models,
// so a later change to a model never rewrites history.
var Migrations = migrate.NewMigrations()

// ddl runs statements in one transaction. "TS" and "BLOB" in a statement
// become the dialect's timestamp and binary types (BYTEA on PostgreSQL).
func ddl(stmts ...string) migrate.MigrationFunc {
	return func(ctx context.Context, db *bun.DB) error {
		ts, blob := "TIMESTAMP", "BLOB"
		if db.Dialect().Name() == dialect.PG {
			ts, blob = "TIMESTAMPTZ", "BYTEA"
		}
		return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			for _, s := range stmts {
				s = strings.ReplaceAll(strings.ReplaceAll(s, " TS", " "+ts), " BLOB", " "+blob)
				if _, err := tx.ExecContext(ctx, s); err != nil {
					return fmt.Errorf("%w\n%s", err, s)
				}
			}
			return nil
		})
	}
}

func noDown(context.Context, *bun.DB) error { return nil }

// Migrate applies every pending migration.
func Migrate(ctx context.Context, db *bun.DB) error {
	// Concurrent processes (a gateway starting, admin commands) wait for
	// each other here rather than fail on bun's lock row, which a killed
	// process would also leave behind: a PostgreSQL advisory lock, or a
	// file lock beside the SQLite file, both released by a dying holder.
	unlock, err := migrationLock(ctx, db)
	if err != nil {
		return fmt.Errorf("lock migrations: %w", err)
	}
	defer unlock()
	m := migrate.NewMigrator(db, Migrations, migrate.WithMarkAppliedOnSuccess(true))
	if err := m.Init(ctx); err != nil {
		return fmt.Errorf("init migrations: %w", err)
	}
	if _, err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// migrationsLockKey is the advisory lock id of Cohort's migrations
// (PostgreSQL): an arbitrary constant, the same in every process.
const migrationsLockKey = 0x436f686f7274 // "Cohort"

func migrationLock(ctx context.Context, db *bun.DB) (func(), error) {
	if db.Dialect().Name() == dialect.PG {
		conn, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(?)", migrationsLockKey); err != nil {
			conn.Close()
			return nil, err
		}
		return func() {
			conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock(?)", migrationsLockKey) //nolint:errcheck
			conn.Close()
		}, nil
	}
	var seq int
	var name, file string
	if err := db.QueryRowContext(ctx, "PRAGMA database_list").Scan(&seq, &name, &file); err != nil {
		return nil, err
	}
	if file == "" { // in memory: one process
		return func() {}, nil
	}
	return lockFile(ctx, file+".migrate-lock")
}
