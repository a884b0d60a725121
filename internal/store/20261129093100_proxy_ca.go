package store

// The gateway's proxy CA (ADR 0932): the certificate jails trust, and its
// private key wrapped by the KEK. One row per gateway installation; every
// replica shares it.
func init() {
	Migrations.MustRegister(ddl(`CREATE TABLE proxy_cas (
			id TEXT PRIMARY KEY,
			cert_pem TEXT NOT NULL,
			wrapped_key BLOB NOT NULL,
			not_after TS NOT NULL,
			created_at TS NOT NULL)`), noDown)
}
