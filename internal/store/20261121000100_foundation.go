package store

// The foundation: organizations, users, workspaces, keys, intern records.
func init() {
	Migrations.MustRegister(ddl(
		`CREATE TABLE organizations (
			id TEXT PRIMARY KEY,
			name TEXT NOT NULL,
			interns_programme BOOLEAN NOT NULL DEFAULT FALSE,
			workload_identity BOOLEAN NOT NULL DEFAULT FALSE,
			vault_writes BOOLEAN NOT NULL DEFAULT FALSE,
			created_at TS NOT NULL)`,
		`CREATE TABLE users (
			id TEXT PRIMARY KEY,
			email TEXT NOT NULL UNIQUE,
			name TEXT NOT NULL,
			created_at TS NOT NULL)`,
		`CREATE TABLE memberships (
			organization_id TEXT NOT NULL REFERENCES organizations(id),
			user_id TEXT NOT NULL REFERENCES users(id),
			role TEXT NOT NULL,
			joined_at TS NOT NULL,
			left_at TS,
			PRIMARY KEY (organization_id, user_id))`,
		`CREATE TABLE workspaces (
			id TEXT PRIMARY KEY,
			organization_id TEXT NOT NULL REFERENCES organizations(id),
			name TEXT NOT NULL,
			slug TEXT NOT NULL,
			description TEXT NOT NULL,
			default_text_model TEXT NOT NULL,
			default_image_model TEXT NOT NULL,
			default_provider_sort TEXT NOT NULL,
			default_guardrail_id TEXT NOT NULL,
			io_logging_api_key_ids TEXT,
			io_logging_sampling_rate DOUBLE PRECISION NOT NULL,
			is_data_discount_logging_enabled BOOLEAN NOT NULL,
			is_observability_broadcast_enabled BOOLEAN NOT NULL,
			is_observability_io_logging_enabled BOOLEAN NOT NULL,
			created_at TS NOT NULL,
			created_by TEXT NOT NULL,
			updated_at TS,
			UNIQUE (organization_id, slug))`,
		`CREATE TABLE grants (
			id TEXT PRIMARY KEY,
			organization_id TEXT NOT NULL REFERENCES organizations(id),
			user_id TEXT NOT NULL REFERENCES users(id),
			workspace_id TEXT REFERENCES workspaces(id),
			created_at TS NOT NULL)`,
		`CREATE INDEX grants_user ON grants (organization_id, user_id)`,
		`CREATE TABLE api_keys (
			id TEXT PRIMARY KEY,
			organization_id TEXT NOT NULL REFERENCES organizations(id),
			workspace_id TEXT REFERENCES workspaces(id),
			user_id TEXT NOT NULL REFERENCES users(id),
			kind TEXT NOT NULL,
			name TEXT NOT NULL,
			prefix TEXT NOT NULL,
			hash TEXT NOT NULL UNIQUE,
			created_at TS NOT NULL,
			disabled_at TS,
			deleted_at TS)`,
		`CREATE INDEX api_keys_org ON api_keys (organization_id)`,
		`CREATE TABLE interns (
			id TEXT PRIMARY KEY,
			organization_id TEXT NOT NULL REFERENCES organizations(id),
			workspace_id TEXT NOT NULL REFERENCES workspaces(id),
			name TEXT NOT NULL,
			model TEXT NOT NULL,
			state TEXT NOT NULL,
			created_by TEXT NOT NULL,
			created_at TS NOT NULL,
			updated_at TS)`,
		`CREATE INDEX interns_workspace ON interns (workspace_id)`,
		`CREATE TABLE meta (
			key TEXT PRIMARY KEY,
			value TEXT NOT NULL)`,
	), noDown)
}
