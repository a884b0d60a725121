package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"

	"github.com/cohort-dev/cohort/internal/apierr"
)

func init() {
	apierr.RegisterClassifier(classify)
}

// classify is what apierr.Internal answers for a database error that is
// not a fault of ours: a request that failed because the database could
// not be reached answers 503 with Retry-After; one whose text PostgreSQL
// cannot hold (a NUL character, bytes that are not UTF-8, which SQLite
// stores as they are) a 400, not 500 internal.
func classify(err error) *apierr.Error {
	if Unavailable(err) {
		return apierr.Unavailable(err)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "22021" || pe.Code == "22P05") {
		return apierr.BadRequest("text must be UTF-8 without NUL characters").WithCause(err)
	}
	return nil
}

// Unavailable reports whether err says the database could not serve the
// statement for now, rather than refusing it: the server is restarting,
// shutting down or unreachable, it closed the connection, it has no room
// for another, or SQLite stayed busy or locked past its busy timeout. A
// retry later may succeed; nothing about the request was wrong.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The request's own deadline or its caller leaving (a deadline
		// is a net.Error too): not the database's state.
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// 08: connection exception; 57P: operator intervention (admin or
		// crash shutdown, cannot connect now); 53300: too many connections.
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P") || pe.Code == "53300"
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		pgconn.SafeToRetry(err)
}

// dialRetry bounds how long a new PostgreSQL connection is retried while
// the server refuses it (restarting: connection refused, or "the database
// system is starting up"), so that a short restart delays requests
// instead of failing them.
const dialRetry = 3 * time.Second

// connectRetrying dials with connect, again every 100 ms for up to
// dialRetry (and never past ctx) while the failure is one a restart
// causes.
func connectRetrying(ctx context.Context, connect func(context.Context) (driver.Conn, error)) (driver.Conn, error) {
	deadline := time.Now().Add(dialRetry)
	for {
		conn, err := connect(ctx)
		if err == nil || !restarting(err) || time.Now().After(deadline) {
			return conn, err
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// restarting reports a connection refused by a server that is not
// listening, or that listens but is starting up or shutting down.
func restarting(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "57P03" || pe.Code == "57P01"
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
