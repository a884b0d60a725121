package store_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// TestMigrationsAndRoundTrip runs the same migrations and the same row
// round trips on both engines.
func TestMigrationsAndRoundTrip(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		// Running the migrations again is a no-op.
		if err := store.Migrate(ctx, db); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC().Truncate(time.Microsecond)
		org := &store.Organization{ID: "o1", Name: "Org", InternsProgramme: true, CreatedAt: now}
		if _, err := db.NewInsert().Model(org).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		ids := `["k1"]`
		ws := &store.Workspace{ID: "w1", OrganizationID: "o1", Name: "W", Slug: "w", IOLoggingAPIKeyIDs: &ids, IOLoggingSamplingRate: 0.0001, IsObservabilityBroadcastEnabled: true, CreatedAt: now, CreatedBy: "u"}
		if _, err := db.NewInsert().Model(ws).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		var got store.Workspace
		if err := db.NewSelect().Model(&got).Where("id = ?", "w1").Scan(ctx); err != nil {
			t.Fatal(err)
		}
		if got.IOLoggingAPIKeyIDs == nil || *got.IOLoggingAPIKeyIDs != ids || got.IOLoggingSamplingRate != 0.0001 ||
			!got.IsObservabilityBroadcastEnabled || got.IsDataDiscountLoggingEnabled || got.UpdatedAt != nil || !got.CreatedAt.Equal(now) {
			t.Fatalf("round trip changed the row: %+v", got)
		}
		// The slug is unique per organization.
		dup := *ws
		dup.ID = "w2"
		_, err := db.NewInsert().Model(&dup).Exec(ctx)
		if !store.IsUniqueViolation(err) {
			t.Fatalf("duplicate slug: want a unique violation, got %v", err)
		}
		// Foreign keys are enforced on both engines.
		orphan := &store.Workspace{ID: "w3", OrganizationID: "nope", Name: "W", Slug: "x", CreatedAt: now}
		if _, err := db.NewInsert().Model(orphan).Exec(ctx); err == nil {
			t.Fatal("foreign key not enforced")
		}
	})
}

func TestOpenRefusesUnknownScheme(t *testing.T) {
	t.Parallel()
	if _, err := store.Open(context.Background(), "mysql://x", t.TempDir()); err == nil {
		t.Fatal("mysql url accepted")
	}
}

// The embedded database acknowledges a write only once it would survive a
// power loss: WAL with synchronous=FULL (2), not NORMAL (1).
func TestEmbeddedSQLiteIsDurable(t *testing.T) {
	db, err := store.Open(context.Background(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var sync int
	var mode string
	if err := db.QueryRow("PRAGMA synchronous").Scan(&sync); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if sync != 2 || mode != "wal" {
		t.Fatalf("synchronous=%d journal_mode=%s, want 2 (FULL) and wal", sync, mode)
	}
}

// Processes migrating at once wait for each other instead of failing on a
// lock (a gateway starting while admin commands run), on both engines.
func TestConcurrentMigrationsWait(t *testing.T) {
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			ctx := context.Background()
			url, dir := "", t.TempDir()
			if engine == "postgres" {
				url = storetest.PostgresURL(t)
			}
			errs := make(chan error, 6)
			for range 6 {
				go func() {
					db, err := store.Open(ctx, url, dir)
					if err != nil {
						errs <- err
						return
					}
					defer db.Close()
					errs <- store.Migrate(ctx, db)
				}()
			}
			for range 6 {
				if err := <-errs; err != nil {
					t.Errorf("concurrent migrate: %v", err)
				}
			}
		})
	}
}

// Backends that PostgreSQL terminates under load (an administrator, a
// failover, a restart) cost no request: a statement the server answered
// with "terminating connection" did not run, and is retried on another
// connection. Every acknowledged insert is there, once.
func TestTerminatedBackendsAreRetried(t *testing.T) {
	ctx := context.Background()
	url := storetest.PostgresURL(t)
	db, err := store.Open(ctx, url, "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE probe (n INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	admin, err := store.Open(ctx, url, "")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var next, acked atomic.Int64
	var failed []error
	var mu sync.Mutex
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, err := db.ExecContext(ctx, "INSERT INTO probe (n) VALUES (?)", next.Add(1)); err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
					continue
				}
				acked.Add(1)
			}
		}()
	}
	// Five rounds of terminating every backend of the database mid-load.
	for range 5 {
		for start := acked.Load(); acked.Load() < start+200; {
			time.Sleep(time.Millisecond)
		}
		if _, err := admin.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	if len(failed) > 0 {
		t.Errorf("%d statements failed, e.g. %v", len(failed), failed[0])
	}
	var count int64
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM probe").Scan(&count); err != nil || count != acked.Load() {
		t.Fatalf("%d rows (%v), %d acknowledged", count, err, acked.Load())
	}
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("ping after: %v", err)
	}
}

// The read pool sees what the writer committed, reads while the writer
// holds a transaction open (WAL), and cannot write; in-memory and
// PostgreSQL databases get none.
func TestSQLiteReadPool(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := store.Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	path, ok := store.SQLiteFile("", dir)
	if !ok {
		t.Fatal("the embedded database is not a file")
	}
	reads, err := store.OpenSQLiteReads(ctx, path, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer reads.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('committed')"); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO t VALUES ('pending')"); err != nil {
		t.Fatal(err)
	}
	var n int
	var v string
	if err := reads.QueryRowContext(ctx, "SELECT count(*), min(v) FROM t").Scan(&n, &v); err != nil || n != 1 || v != "committed" {
		t.Fatalf("read beside an open write: %d %q %v", n, v, err)
	}
	if _, err := reads.ExecContext(ctx, "INSERT INTO t VALUES ('from the pool')"); err == nil {
		t.Fatal("the read pool wrote")
	}
	for _, url := range []string{"sqlite::memory:", "postgres://x@y/z"} {
		if _, ok := store.SQLiteFile(url, dir); ok {
			t.Errorf("%s has a read pool", url)
		}
	}
}

// A transaction that reads and then writes, while another process (here
// another handle on the same file) writes in between, commits: it holds
// the write lock from BEGIN, so the other writer waits for it instead of
// leaving it with a stale snapshot and SQLITE_BUSY at its first write.
func TestSQLiteReadThenWriteBesideAnotherWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := t.TempDir() + "/cohort.db"
	open := func() *bun.DB {
		db, err := store.OpenSQLite(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	a, b := open(), open()
	if _, err := a.ExecContext(ctx, "CREATE TABLE t (n INTEGER)"); err != nil {
		t.Fatal(err)
	}
	other := make(chan error, 1)
	err := a.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
			return err
		}
		go func() {
			_, err := b.ExecContext(ctx, "INSERT INTO t VALUES (2)")
			other <- err
		}()
		// Give the other writer time to commit if nothing stops it.
		select {
		case err := <-other:
			other <- err
		case <-time.After(300 * time.Millisecond):
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (1)")
		return err
	})
	if err != nil {
		t.Fatalf("read-then-write transaction: %v", err)
	}
	if err := <-other; err != nil {
		t.Fatalf("the other writer: %v", err)
	}
	var n int
	if err := a.QueryRowContext(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows %d, %v; want 2", n, err)
	}
}
