package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/storetest"
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
