package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

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
	conn, err := connectRetrying(ctx, c.Connector.Connect)
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
	return r, terminatedRead(query, err)
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

// terminatedRead is terminated for a query, which may also have been cut
// after it was sent (the server restarting, the connection reset): a
// plain SELECT changes nothing, so running it again on another connection
// is safe, and database/sql does so for a bad connection. (Inside a
// transaction database/sql retries nothing: the error reaches the caller,
// a 503.)
func terminatedRead(query string, err error) error {
	if err == nil {
		return nil
	}
	if readOnly(query) && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		return driver.ErrBadConn
	}
	return terminated(err)
}

// readOnly reports a statement that only reads: a SELECT that locks
// nothing.
func readOnly(query string) bool {
	q := strings.TrimSpace(query)
	if len(q) < 6 || !strings.EqualFold(q[:6], "SELECT") {
		return false
	}
	u := strings.ToUpper(q)
	return !strings.Contains(u, " FOR UPDATE") && !strings.Contains(u, " FOR SHARE") && !strings.Contains(u, "NEXTVAL(")
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

// PrepareContext maps terminations of the statement's executions too: a
// prepared statement runs on its connection's pgx methods, not on
// retryConn's, and the auth lookup is one.
func (c *retryConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, terminated(err)
	}
	return retryStmt{st.(*stdlib.Stmt), query}, nil
}

// Ping reports a terminated backend as a bad connection, which
// database/sql retries on another (readiness must not fail on one dead
// pooled connection).
func (c *retryConn) Ping(ctx context.Context) error {
	return terminated(c.Conn.Ping(ctx))
}

type retryStmt struct {
	*stdlib.Stmt
	query string
}

func (s retryStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	r, err := s.Stmt.ExecContext(ctx, args)
	return r, terminated(err)
}

func (s retryStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	r, err := s.Stmt.QueryContext(ctx, args)
	return r, terminatedRead(s.query, err)
}
