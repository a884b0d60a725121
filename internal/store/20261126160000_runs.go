package store

// Background runs (docs/background.md): a run's status, and its chunks in
// order, kept for readers that come later (bounded per run and by a
// retention period, ADR 0033).
func init() {
	Migrations.MustRegister(ddl(
		`CREATE TABLE runs (
			id TEXT PRIMARY KEY,
			organization_id TEXT NOT NULL,
			workspace_id TEXT NOT NULL,
			intern_id TEXT NOT NULL,
			session_id TEXT NOT NULL DEFAULT '',
			daemon_run_id TEXT NOT NULL DEFAULT '',
			caller TEXT NOT NULL DEFAULT '',
			status TEXT NOT NULL,
			pending TEXT NOT NULL DEFAULT '',
			error TEXT NOT NULL DEFAULT '',
			usage TEXT NOT NULL DEFAULT '',
			completion_id TEXT NOT NULL DEFAULT '',
			completion_created BIGINT NOT NULL DEFAULT 0,
			daemon_seq BIGINT NOT NULL DEFAULT 0,
			last_seq BIGINT NOT NULL DEFAULT 0,
			event_bytes BIGINT NOT NULL DEFAULT 0,
			events_truncated BOOLEAN NOT NULL DEFAULT FALSE,
			cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
			segment_open BOOLEAN NOT NULL DEFAULT FALSE,
			pause_deadline TS,
			lease_owner TEXT NOT NULL DEFAULT '',
			lease_until TS,
			created_at TS NOT NULL,
			updated_at TS NOT NULL,
			ended_at TS)`,
		`CREATE INDEX runs_workspace_status ON runs (workspace_id, status)`,
		`CREATE INDEX runs_session ON runs (intern_id, session_id, created_at)`,
		`CREATE INDEX runs_status_lease ON runs (status, lease_until)`,
		`CREATE INDEX runs_ended ON runs (ended_at)`,
		`CREATE TABLE run_events (
			run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
			seq BIGINT NOT NULL,
			data TEXT NOT NULL,
			PRIMARY KEY (run_id, seq))`,
	), noDown)
}
