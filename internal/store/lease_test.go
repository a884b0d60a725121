package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

type leased struct {
	bun.BaseModel `bun:"table:lease_test"`
	ID            string     `bun:"id,pk"`
	LeaseOwner    string     `bun:"lease_owner,notnull"`
	LeaseUntil    *time.Time `bun:"lease_until"`
}

// A lease that ends at t is free at t, not a moment before; taken, it is
// the taker's until its term passes; renewed, it runs a term from then;
// released, it is free at once, even on a clock a little behind (ADR 0952).
func TestLeaseBound(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		ctx := context.Background()
		if _, err := db.NewCreateTable().Model((*leased)(nil)).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
		a, b := store.Lease{Owner: "a", Term: time.Minute}, store.Lease{Owner: "b", Term: time.Minute}
		if _, err := db.NewInsert().Model(&leased{ID: "r"}).Exec(ctx); err != nil {
			t.Fatal(err)
		}
		take := func(l store.Lease, now time.Time) bool {
			t.Helper()
			res, err := db.NewUpdate().Model((*leased)(nil)).Set(l.Take(now)).Where("id = ?", "r").Where(store.LeaseFree("", now)).Exec(ctx)
			if err != nil {
				t.Fatal(err)
			}
			n, _ := res.RowsAffected()
			return n == 1
		}
		free := func(now time.Time) bool {
			t.Helper()
			n, err := db.NewSelect().Model((*leased)(nil)).Where(store.LeaseFree("", now)).Count(ctx)
			h, err2 := db.NewSelect().Model((*leased)(nil)).Where(store.LeaseHeld("", now)).Count(ctx)
			if err != nil || err2 != nil || n+h != 1 {
				t.Fatalf("free %d, held %d (%v, %v): one of the two, always", n, h, err, err2)
			}
			return n == 1
		}
		if !free(t0) || !take(a, t0) {
			t.Fatal("a lease never taken is free")
		}
		end := a.Until(t0)
		if free(end.Add(-time.Microsecond)) || take(b, end.Add(-time.Microsecond)) {
			t.Fatal("a lease was free before its end")
		}
		if !free(end) || !take(b, end) {
			t.Fatal("a lease that ends at t is not free at t")
		}
		// a's lease is gone: it can neither renew nor release b's.
		res, err := a.Extend(db.NewUpdate().Model((*leased)(nil)), end).Where("id = ?", "r").Exec(ctx)
		if n, _ := res.RowsAffected(); err != nil || n != 0 {
			t.Fatalf("a renewed a lease b took: %d, %v", n, err)
		}
		if res, err = b.Extend(db.NewUpdate().Model((*leased)(nil)), end.Add(30*time.Second)).Where("id = ?", "r").Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != 1 || free(end.Add(time.Minute)) || !free(end.Add(90*time.Second)) {
			t.Fatal("a renewal does not run a term from when it was made")
		}
		if _, err := b.Release(db.NewUpdate().Model((*leased)(nil))).Where("id = ?", "r").Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if !free(end) || !take(a, end.Add(-time.Hour)) {
			t.Fatal("a released lease is not free at once")
		}
	})
}
