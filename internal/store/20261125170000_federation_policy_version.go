package store

import (
	"context"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
)

// Every federation policy gets a version that changes, in the same
// transaction, with anything its token exchange reads: the policy row, its
// issuer, its organization's workload identity entitlement, and its target
// API key's kind, disabled and deleted state. Triggers keep it, so a change
// made by any writer (the API on any replica, the operator's CLI, plain
// SQL) changes it. A gateway that keeps a policy in memory reads only the
// version on each exchange and reloads the policy when it differs
// (internal/federation).
//
// A version is random rather than counted: a policy deleted and inserted
// again under the same id (a restore) cannot meet a version a gateway
// still holds.
func init() {
	Migrations.MustRegister(func(ctx context.Context, db *bun.DB) error {
		if db.Dialect().Name() == dialect.PG {
			return ddl(
				`ALTER TABLE federation_policies ADD COLUMN version BIGINT NOT NULL DEFAULT 0`,
				`CREATE FUNCTION cohort_federation_policy_version() RETURNS trigger AS $$
BEGIN
  NEW.version := (random() * 9.2e18)::bigint;
  RETURN NEW;
END $$ LANGUAGE plpgsql`,
				`CREATE TRIGGER federation_policies_version BEFORE INSERT OR UPDATE ON federation_policies
  FOR EACH ROW EXECUTE FUNCTION cohort_federation_policy_version()`,
				`UPDATE federation_policies SET version = 0`,
				// The argument names the policies' column that refers to
				// the changed row.
				`CREATE FUNCTION cohort_federation_policies_touch() RETURNS trigger AS $$
BEGIN
  EXECUTE format('UPDATE federation_policies SET version = 0 WHERE %I = $1', TG_ARGV[0]) USING OLD.id;
  RETURN NULL;
END $$ LANGUAGE plpgsql`,
				`CREATE TRIGGER federation_policies_issuer AFTER UPDATE OR DELETE ON federation_issuers
  FOR EACH ROW EXECUTE FUNCTION cohort_federation_policies_touch('issuer_id')`,
				`CREATE TRIGGER federation_policies_organization AFTER UPDATE ON organizations
  FOR EACH ROW WHEN (OLD.workload_identity IS DISTINCT FROM NEW.workload_identity)
  EXECUTE FUNCTION cohort_federation_policies_touch('organization_id')`,
				`CREATE TRIGGER federation_policies_organization_delete AFTER DELETE ON organizations
  FOR EACH ROW EXECUTE FUNCTION cohort_federation_policies_touch('organization_id')`,
				`CREATE TRIGGER federation_policies_api_key AFTER UPDATE ON api_keys
  FOR EACH ROW WHEN (OLD.kind IS DISTINCT FROM NEW.kind OR OLD.disabled_at IS DISTINCT FROM NEW.disabled_at
    OR OLD.deleted_at IS DISTINCT FROM NEW.deleted_at)
  EXECUTE FUNCTION cohort_federation_policies_touch('api_key_id')`,
				`CREATE TRIGGER federation_policies_api_key_delete AFTER DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION cohort_federation_policies_touch('api_key_id')`,
			)(ctx, db)
		}
		// SQLite: a trigger cannot assign NEW, so the policy's own triggers
		// update the row after the fact (the WHEN stops the update from
		// triggering itself).
		return ddl(
			`ALTER TABLE federation_policies ADD COLUMN version INTEGER NOT NULL DEFAULT 0`,
			`UPDATE federation_policies SET version = random()`,
			`CREATE TRIGGER federation_policies_version_insert AFTER INSERT ON federation_policies
BEGIN UPDATE federation_policies SET version = random() WHERE id = NEW.id; END`,
			`CREATE TRIGGER federation_policies_version_update AFTER UPDATE ON federation_policies
WHEN NEW.version = OLD.version
BEGIN UPDATE federation_policies SET version = random() WHERE id = NEW.id; END`,
			`CREATE TRIGGER federation_policies_issuer AFTER UPDATE ON federation_issuers
BEGIN UPDATE federation_policies SET version = random() WHERE issuer_id = OLD.id; END`,
			`CREATE TRIGGER federation_policies_issuer_delete AFTER DELETE ON federation_issuers
BEGIN UPDATE federation_policies SET version = random() WHERE issuer_id = OLD.id; END`,
			`CREATE TRIGGER federation_policies_organization AFTER UPDATE ON organizations
WHEN OLD.workload_identity IS NOT NEW.workload_identity
BEGIN UPDATE federation_policies SET version = random() WHERE organization_id = OLD.id; END`,
			`CREATE TRIGGER federation_policies_organization_delete AFTER DELETE ON organizations
BEGIN UPDATE federation_policies SET version = random() WHERE organization_id = OLD.id; END`,
			`CREATE TRIGGER federation_policies_api_key AFTER UPDATE ON api_keys
WHEN OLD.kind IS NOT NEW.kind OR OLD.disabled_at IS NOT NEW.disabled_at OR OLD.deleted_at IS NOT NEW.deleted_at
BEGIN UPDATE federation_policies SET version = random() WHERE api_key_id = OLD.id; END`,
			`CREATE TRIGGER federation_policies_api_key_delete AFTER DELETE ON api_keys
BEGIN UPDATE federation_policies SET version = random() WHERE api_key_id = OLD.id; END`,
		)(ctx, db)
	}, noDown)
}
