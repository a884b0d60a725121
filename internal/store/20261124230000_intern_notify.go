package store

import (
	"context"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
)

// InternsChannel is the PostgreSQL notification channel on which every
// change to an intern row is announced, whoever made it (the API, the
// operator's CLI, another replica): the local provisioner's reconciler
// listens to it. SQLite has no equivalent; the reconciler's sweep covers it.
const InternsChannel = "cohort_interns"

func init() {
	Migrations.MustRegister(func(ctx context.Context, db *bun.DB) error {
		if db.Dialect().Name() != dialect.PG {
			return nil
		}
		return ddl(
			`CREATE FUNCTION cohort_interns_notify() RETURNS trigger AS $$
BEGIN
  PERFORM pg_notify('`+InternsChannel+`', COALESCE(NEW.id, OLD.id));
  RETURN NULL;
END $$ LANGUAGE plpgsql`,
			`CREATE TRIGGER interns_notify AFTER INSERT OR UPDATE OR DELETE ON interns
  FOR EACH ROW EXECUTE FUNCTION cohort_interns_notify()`,
		)(ctx, db)
	}, noDown)
}
