package store

// Webhooks: a workspace's endpoints (their signing secrets wrapped by the
// KEK) and the durable outbox of deliveries, written in the transaction
// that changes a run's status and drained by every replica's worker
// (ADR 0034).
func init() {
	stmts := []string{
		`CREATE TABLE webhook_endpoints (
			id TEXT PRIMARY KEY,
			organization_id TEXT NOT NULL REFERENCES organizations(id),
			workspace_id TEXT NOT NULL REFERENCES workspaces(id),
			url TEXT NOT NULL,
			events TEXT NOT NULL,
			description TEXT NOT NULL DEFAULT '',
			enabled BOOLEAN NOT NULL,
			secret BLOB NOT NULL,
			previous_secret BLOB,
			previous_until TS,
			secret_rotated_at TS,
			created_at TS NOT NULL,
			updated_at TS NOT NULL)`,
		`CREATE INDEX webhook_endpoints_workspace ON webhook_endpoints (workspace_id)`,
		`CREATE TABLE webhook_deliveries (
			id TEXT PRIMARY KEY,
			endpoint_id TEXT NOT NULL REFERENCES webhook_endpoints(id) ON DELETE CASCADE,
			workspace_id TEXT NOT NULL,
			event_type TEXT NOT NULL,
			payload TEXT NOT NULL,
			status TEXT NOT NULL,
			attempts INTEGER NOT NULL DEFAULT 0,
			next_attempt_at TS NOT NULL,
			lease_owner TEXT,
			lease_until TS,
			last_status_code INTEGER NOT NULL DEFAULT 0,
			last_error TEXT NOT NULL DEFAULT '',
			last_attempt_at TS,
			delivered_at TS,
			created_at TS NOT NULL)`,
		// The worker's claim: pending rows by due time.
		`CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_attempt_at)`,
		`CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at)`,
	}
	Migrations.MustRegister(ddl(stmts...), noDown)
}
