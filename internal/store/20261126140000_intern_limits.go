package store

// Each intern may have bounds of its own, below the operator's --intern-*
// settings (ADR 0024):
// 0 is the operator's setting, so existing rows keep it.
func init() {
	Migrations.MustRegister(ddl(
		`ALTER TABLE interns ADD COLUMN limit_memory BIGINT NOT NULL DEFAULT 0`,
		`ALTER TABLE interns ADD COLUMN limit_processes INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE interns ADD COLUMN limit_cpu_weight INTEGER NOT NULL DEFAULT 0`,
		`ALTER TABLE interns ADD COLUMN limit_cpus DOUBLE PRECISION NOT NULL DEFAULT 0`,
		`ALTER TABLE interns ADD COLUMN limit_tmpfs BIGINT NOT NULL DEFAULT 0`,
		`ALTER TABLE interns ADD COLUMN limit_disk BIGINT NOT NULL DEFAULT 0`,
	), noDown)
}
