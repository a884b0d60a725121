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

// ddl runs statements in one transaction. "TS" in a statement becomes the
// dialect's timestamp type.
func ddl(stmts ...string) migrate.MigrationFunc {
	return func(ctx context.Context, db *bun.DB) error {
		ts := "TIMESTAMP"
		if db.Dialect().Name() == dialect.PG {
			ts = "TIMESTAMPTZ"
		}
		return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			for _, s := range stmts {
				s = strings.ReplaceAll(s, " TS", " "+ts)
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
	m := migrate.NewMigrator(db, Migrations, migrate.WithMarkAppliedOnSuccess(true))
	if err := m.Init(ctx); err != nil {
		return fmt.Errorf("init migrations: %w", err)
	}
	if err := m.Lock(ctx); err != nil {
		return fmt.Errorf("lock migrations: %w", err)
	}
	defer m.Unlock(ctx) //nolint:errcheck
	if _, err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}
