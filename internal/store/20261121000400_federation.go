package store

// Workload identity federation: trusted issuers, exchange policies, the
// audit of exchanges, and the ES256 keys that sign access tokens.
func init() {
	Migrations.MustRegister(ddl(
		`CREATE TABLE federation_issuers (
			id TEXT PRIMARY KEY,
			organization_id TEXT NOT NULL REFERENCES organizations(id),
			name TEXT NOT NULL,
			issuer_url TEXT NOT NULL,
			jwks_url TEXT NOT NULL,
			revision INTEGER NOT NULL,
			created_at TS NOT NULL,
			updated_at TS,
			UNIQUE (organization_id, issuer_url))`,
		`CREATE TABLE federation_policies (
			id TEXT PRIMARY KEY,
			organization_id TEXT NOT NULL REFERENCES organizations(id),
			issuer_id TEXT NOT NULL REFERENCES federation_issuers(id),
			subject TEXT NOT NULL,
			audience TEXT NOT NULL,
			condition_expr TEXT NOT NULL,
			api_key_id TEXT NOT NULL REFERENCES api_keys(id),
			enabled BOOLEAN NOT NULL,
			scopes_check TEXT,
			token_type_check TEXT,
			created_at TS NOT NULL,
			updated_at TS)`,
		`CREATE INDEX federation_policies_org ON federation_policies (organization_id, issuer_id)`,
		`CREATE TABLE federation_exchanges (
			id TEXT PRIMARY KEY,
			organization_id TEXT NOT NULL,
			policy_id TEXT NOT NULL,
			issuer_id TEXT NOT NULL,
			at TS NOT NULL,
			outcome TEXT NOT NULL,
			failed_check TEXT NOT NULL,
			detail TEXT NOT NULL,
			subject TEXT NOT NULL,
			source_address TEXT NOT NULL,
			token_id TEXT NOT NULL,
			api_key_id TEXT NOT NULL)`,
		`CREATE INDEX federation_exchanges_org ON federation_exchanges (organization_id, at, id)`,
		`CREATE TABLE signing_keys (
			id TEXT PRIMARY KEY,
			generation INTEGER NOT NULL UNIQUE,
			algorithm TEXT NOT NULL,
			public_key TEXT NOT NULL,
			private_key_wrapped TEXT NOT NULL,
			sign_from TS NOT NULL,
			sign_until TS NOT NULL,
			publish_until TS NOT NULL,
			created_at TS NOT NULL)`,
	), noDown)
}
