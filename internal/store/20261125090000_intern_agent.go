package store

// Each intern names its agent ("" is the gateway's default, the built-in
// agent unless the operator set --agent-command): docs/agents.md.
func init() {
	Migrations.MustRegister(ddl(
		`ALTER TABLE interns ADD COLUMN agent TEXT NOT NULL DEFAULT ''`,
	), noDown)
}
