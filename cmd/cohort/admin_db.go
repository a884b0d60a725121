package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/jackc/pgx/v5"
	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/store"
)

// createHint says how to make what an admin command found missing: the
// admin CLI only creates with --init, so a wrong directory or a typo in
// --data-dir is an error instead of a new, empty database.
const createHint = `start "cohort serve" once with the same --data-dir/--database-url, run "cohort migrate" with them, or repeat this command with --init; nothing was created`

// openAdminDB opens the configured database for an admin command and
// applies pending migrations. Without init it creates nothing: the SQLite
// file (and its data directory) must exist, and a PostgreSQL database must
// already hold Cohort's schema.
func openAdminDB(ctx context.Context, cfg config.Store, init bool) (*bun.DB, error) {
	if init {
		return openDB(ctx, cfg)
	}
	path, onDisk := store.SQLiteFile(cfg.DatabaseURL, cfg.DataDir)
	if onDisk {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			check := "--data-dir or COHORT_DATA_DIR"
			if cfg.DatabaseURL != "" {
				check = "--database-url or COHORT_DATABASE_URL"
			}
			dir := filepath.Dir(path)
			if _, derr := os.Stat(dir); errors.Is(derr, fs.ErrNotExist) {
				return nil, fmt.Errorf("no Cohort database: the directory %s does not exist (check %s); %s", dir, check, createHint)
			}
			return nil, fmt.Errorf("no Cohort database at %s (check %s); %s", path, check, createHint)
		} else if err != nil {
			return nil, fmt.Errorf("database %s: %w", path, err)
		}
	}
	db, err := store.Open(ctx, cfg.DatabaseURL, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	// In memory nothing outlives the command, so there is nothing to refuse.
	if store.IsPostgres(cfg.DatabaseURL) || onDisk {
		ok, err := store.HasSchema(ctx, db)
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("read the database's migrations: %w", err)
		}
		if !ok {
			db.Close()
			where := path
			if store.IsPostgres(cfg.DatabaseURL) {
				where = pgName(cfg.DatabaseURL)
			}
			return nil, fmt.Errorf("%s holds no Cohort database (no migrations applied); %s", where, createHint)
		}
	}
	if err := store.Migrate(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// pgName names a PostgreSQL database for an error without its password.
func pgName(url string) string {
	c, err := pgx.ParseConfig(url)
	if err != nil {
		return "the PostgreSQL database"
	}
	return fmt.Sprintf("the PostgreSQL database %q on %s:%d", c.Database, c.Host, c.Port)
}

// adminKEK loads the key-encryption key for an admin command. Like the
// database, the default file in the data directory is created only with
// --init: a new key beside an existing database could never open the
// secrets already wrapped under the old one.
func adminKEK(e *adminEnv) (*envelope.KEK, error) {
	if e.cfg.Store.KEKFile != "" {
		return envelope.Load(e.cfg.Store.KEKFile)
	}
	path := e.cfg.Store.KEKPath()
	if !e.init {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf(`no key-encryption key at %s (check --data-dir, or give --kek-file); "cohort serve" creates it on first start, or repeat this command with --init; nothing was created`, path)
		}
	}
	if err := os.MkdirAll(e.cfg.Store.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	return envelope.LoadOrCreate(path)
}
