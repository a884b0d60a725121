package store

// The vault: one vault per owner (an intern now, a workspace later) with its
// wrapped data keys, the secrets encrypted under them, and the audit of
// every release decision.
func init() {
	stmts := []string{
		`CREATE TABLE vaults (
			id TEXT PRIMARY KEY,
			organization_id TEXT NOT NULL REFERENCES organizations(id),
			scope_kind TEXT NOT NULL,
			owner_id TEXT NOT NULL,
			data_keyset BLOB NOT NULL,
			mac_keyset BLOB NOT NULL,
			created_at TS NOT NULL,
			rewrapped_at TS,
			UNIQUE (scope_kind, owner_id))`,
		`CREATE TABLE vault_secrets (
			vault_id TEXT NOT NULL REFERENCES vaults(id),
			name TEXT NOT NULL,
			ciphertext BLOB NOT NULL,
			hosts TEXT,
			fingerprint TEXT,
			created_at TS NOT NULL,
			updated_at TS,
			PRIMARY KEY (vault_id, name))`,
		`CREATE TABLE vault_releases (
			id TEXT PRIMARY KEY,
			organization_id TEXT,
			intern_id TEXT NOT NULL,
			vault_id TEXT,
			secret_name TEXT NOT NULL,
			host TEXT NOT NULL,
			outcome TEXT NOT NULL,
			reason TEXT NOT NULL,
			actor TEXT NOT NULL,
			created_at TS NOT NULL)`,
		`CREATE INDEX vault_releases_intern ON vault_releases (intern_id, created_at)`,
	}
	Migrations.MustRegister(ddl(stmts...), noDown)
}
