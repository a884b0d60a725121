package store

import (
	"context"
	"strings"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
)

// The gateway's proxy CA (ADR 0932): the certificate jails trust, and its
// private key wrapped by the KEK. One row per gateway installation; every
// replica shares it.
func init() {
	stmt := `CREATE TABLE proxy_cas (
			id TEXT PRIMARY KEY,
			cert_pem TEXT NOT NULL,
			wrapped_key BLOB NOT NULL,
			not_after TS NOT NULL,
			created_at TS NOT NULL)`
	Migrations.MustRegister(func(ctx context.Context, db *bun.DB) error {
		if db.Dialect().Name() == dialect.PG {
			stmt = strings.ReplaceAll(stmt, " BLOB", " BYTEA")
		}
		return ddl(stmt)(ctx, db)
	}, noDown)
}
