package store_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// HasSchema tells an empty database from one Cohort migrated, on both.
func TestHasSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	check := func(t *testing.T, db *bun.DB) {
		if ok, err := store.HasSchema(ctx, db); err != nil || ok {
			t.Fatalf("empty database: HasSchema = %v, %v; want false", ok, err)
		}
		if err := store.Migrate(ctx, db); err != nil {
			t.Fatal(err)
		}
		if ok, err := store.HasSchema(ctx, db); err != nil || !ok {
			t.Fatalf("migrated database: HasSchema = %v, %v; want true", ok, err)
		}
	}
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		db, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "empty.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		check(t, db)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		db, err := store.Open(ctx, storetest.PostgresURL(t), "")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		check(t, db)
	})
}

// Placeholders are numbered: a query may name its second argument first.
func TestPlaceholderNumbered(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		q := "SELECT CAST(" + store.Placeholder(db, 2) + " AS TEXT) || CAST(" + store.Placeholder(db, 1) + " AS TEXT)"
		var got string
		if err := db.DB.QueryRowContext(context.Background(), q, "a", "b").Scan(&got); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if got != "ba" {
			t.Fatalf("%s with a, b = %q, want ba", q, got)
		}
	})
}

// XactLock holds its key until the transaction ends (PostgreSQL: another
// session cannot take it meanwhile); on SQLite it is a no-op that succeeds.
func TestXactLock(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		tryOther := func() bool {
			var ok bool
			if err := db.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock(hashtext(?))", "test:key").Scan(&ok); err != nil {
				t.Fatal(err)
			}
			return ok
		}
		err := db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
			if err := store.XactLock(ctx, tx, "test:key"); err != nil {
				return err
			}
			if db.Dialect().Name().String() == "pg" && tryOther() {
				t.Error("another session took the key while the transaction held it")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if db.Dialect().Name().String() == "pg" && !tryOther() {
			t.Error("the key is still held after the transaction ended")
		}
	})
}

// NotLive matches a name exactly while no LiveLock of it is held.
func TestLiveLock(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		const ns = 0x7465
		cond, args, ok := store.NotLive(db, "t.owner", ns)
		if db.Dialect().Name().String() != "pg" {
			if ok {
				t.Fatal("SQLite cannot tell a live process: NotLive must say so")
			}
			store.NewLiveLock(db, ns, "gw_a").Hold(ctx) // holds nothing, fails nothing
			return
		}
		if !ok {
			t.Fatal("PostgreSQL tells a dead process from a live one: NotLive must say it can")
		}
		dead := func(name string) bool {
			var n int
			q := "SELECT count(*) FROM (SELECT CAST(? AS TEXT) AS owner) t WHERE " + cond
			if err := db.NewRaw(q, append([]any{name}, args...)...).Scan(ctx, &n); err != nil {
				t.Fatal(err)
			}
			return n == 1
		}
		l := store.NewLiveLock(db, ns, "gw_a")
		if !dead("gw_a") {
			t.Fatal("gw_a is live before its lock is held")
		}
		l.Hold(ctx)
		if dead("gw_a") {
			t.Fatal("gw_a is not live while it holds its lock")
		}
		if !dead("gw_b") {
			t.Fatal("gw_b is live: gw_a's lock counts for another name")
		}
		l.Hold(ctx) // again: still held, not taken twice
		l.Release()
		if !dead("gw_a") {
			t.Fatal("gw_a is live after Release")
		}
	})
}

// Listen calls ready once listening, then onNotify for a notification on
// its channel, and ends with its context; SQLite has no notifications.
func TestListen(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		if !store.Notifies(db) {
			if db.Dialect().Name().String() == "pg" {
				t.Fatal("PostgreSQL notifies")
			}
			if err := store.Listen(context.Background(), db, "cohort_test", func() {}, func() {}); err == nil {
				t.Fatal("Listen on SQLite: no error")
			}
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		ready, got := make(chan struct{}), make(chan struct{}, 1)
		done := make(chan error, 1)
		go func() {
			done <- store.Listen(ctx, db, "cohort_test", func() { close(ready) }, func() {
				select {
				case got <- struct{}{}:
				default:
				}
			})
		}()
		wait := func(c <-chan struct{}, what string) {
			select {
			case <-c:
			case err := <-done:
				t.Fatalf("Listen ended before %s: %v", what, err)
			case <-time.After(10 * time.Second):
				t.Fatalf("no %s in 10s", what)
			}
		}
		wait(ready, "ready")
		if _, err := db.ExecContext(context.Background(), "SELECT pg_notify('cohort_test', 'x')"); err != nil {
			t.Fatal(err)
		}
		wait(got, "notification")
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Listen did not end with its context")
		}
		var one int
		if err := db.DB.QueryRowContext(context.Background(), "SELECT 1").Scan(&one); err != nil && err != sql.ErrNoRows {
			t.Fatalf("the pool after Listen ended: %v", err)
		}
	})
}
