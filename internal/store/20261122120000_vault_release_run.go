package store

// The second half of the vault: each release decision records the daemon
// run that asked and which vault answered (an intern's or its workspace's),
// and organization admins list decisions newest first.
func init() {
	Migrations.MustRegister(ddl(
		`ALTER TABLE vault_releases ADD COLUMN run_id TEXT`,
		`ALTER TABLE vault_releases ADD COLUMN vault_scope TEXT NOT NULL DEFAULT ''`,
		`CREATE INDEX vault_releases_org ON vault_releases (organization_id, created_at)`,
	), noDown)
}
