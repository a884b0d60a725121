package store

import (
	"context"
	"database/sql/driver"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// retryConnector hands database/sql PostgreSQL connections that report a
// backend the server terminated (an administrator, a failover, a restart:
// SQLSTATE class 57P) as a bad connection. The server sends that error in
// place of the statement's result, so the statement did not run, and
// database/sql retries it on another connection instead of failing the
// request. (pgx itself covers errors met before anything was sent.)
type retryConnector struct{ driver.Connector }

func (c retryConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &retryConn{conn.(*stdlib.Conn)}, nil
}

// retryConn is pgx's connection (every interface it implements, promoted)
// with the statement entry points mapping terminations.
type retryConn struct{ *stdlib.Conn }

func (c *retryConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.Conn.ExecContext(ctx, query, args)
	return r, terminated(err)
}

func (c *retryConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.Conn.QueryContext(ctx, query, args)
	return r, terminated(err)
}

func (c *retryConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.BeginTx(ctx, opts)
	return tx, terminated(err)
}

// terminated maps the server's "this backend is going away" errors to
// driver.ErrBadConn.
func terminated(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return driver.ErrBadConn
		}
	}
	return err
}

// PgxConn is the pgx connection behind a database/sql driver connection
// (inside sql.Conn.Raw), for what database/sql cannot do: LISTEN.
func PgxConn(dc any) (*pgx.Conn, bool) {
	switch c := dc.(type) {
	case *retryConn:
		return c.Conn.Conn(), true
	case *stdlib.Conn:
		return c.Conn(), true
	}
	return nil, false
}
