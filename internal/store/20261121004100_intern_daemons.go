package store

// Where each intern's daemon is and how to reach it: its URL, the secret
// the gateway presents (wrapped by the key-encryption key, base64; never in
// clear) and which provisioner runs it.
func init() {
	Migrations.MustRegister(ddl(
		`ALTER TABLE interns ADD COLUMN daemon_url TEXT NOT NULL DEFAULT ''`,
		`ALTER TABLE interns ADD COLUMN daemon_secret TEXT NOT NULL DEFAULT ''`,
		`ALTER TABLE interns ADD COLUMN provisioner TEXT NOT NULL DEFAULT ''`,
	), noDown)
}
