package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
)

// The seam between Cohort and its two databases (ADR 0049): every place
// where SQLite and PostgreSQL need different SQL or a different mechanism
// is a helper here, named after the capability, so no package outside
// store branches on the dialect (TestNoDialectOutsideStore keeps it so).
// SQLite is one process's file with one writer connection (OpenSQLite),
// so what PostgreSQL needs locks for, SQLite already has by serialising
// writers; what PostgreSQL offers beyond locks (notifications, liveness
// of another process) SQLite has no way to offer, and callers fall back
// on their sweeps and leases.

func postgres(db bun.IDB) bool { return db.Dialect().Name() == dialect.PG }

// Placeholder is the n-th (1-based) numbered placeholder of db's dialect,
// for SQL handed to database/sql directly (prepared statements on hot
// paths) rather than through bun, which rewrites "?" itself: $n on
// PostgreSQL, ?n on SQLite. Numbered, a query may name an argument before
// an earlier one in its text.
func Placeholder(db bun.IDB, n int) string {
	if postgres(db) {
		return "$" + strconv.Itoa(n)
	}
	return "?" + strconv.Itoa(n)
}

// TimeArg is t as an argument of SQL handed to database/sql directly. On
// SQLite a timestamp is text: it is written exactly as bun writes it, so
// bun's reads and comparisons ("at < ?") see one format; PostgreSQL takes
// the time itself.
func TimeArg(db bun.IDB, t time.Time) any {
	if postgres(db) {
		return t
	}
	return t.UTC().Format("2006-01-02 15:04:05.999999-07:00")
}

// ForUpdate locks the rows q reads until its transaction ends (PostgreSQL:
// another transaction's read-modify-write of the row waits). SQLite needs
// no lock: its one writer connection already serialises the transactions
// that write.
func ForUpdate(q *bun.SelectQuery) *bun.SelectQuery {
	if postgres(q.DB()) {
		return q.For("UPDATE")
	}
	return q
}

// SkipLocked is the clause that ends a subquery choosing due work to
// claim, with alias the table whose rows are claimed: on PostgreSQL,
// replicas claiming at once skip each other's rows instead of waiting for
// them, and never take the same one. On SQLite it is empty: one writer
// claims at a time.
func SkipLocked(db bun.IDB, alias string) string {
	if postgres(db) {
		return " FOR UPDATE OF " + alias + " SKIP LOCKED"
	}
	return ""
}

// XactLock takes, until tx ends, the lock named key: transactions of other
// processes taking the same key wait for it (PostgreSQL's transaction
// advisory lock on hashtext(key)). SQLite's transactions are serialised by
// its one writer, so there it takes nothing.
func XactLock(ctx context.Context, tx bun.Tx, key string) error {
	if !postgres(tx) {
		return nil
	}
	_, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext(?))", key)
	return err
}

// HasSchema reports whether Cohort's migrations ever ran on db: bun's
// migrations table exists (each dialect has its own catalogue) and lists
// at least one.
func HasSchema(ctx context.Context, db bun.IDB) (bool, error) {
	q := "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'bun_migrations'"
	if postgres(db) {
		q = "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'bun_migrations'"
	}
	var n int
	if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil || n == 0 {
		return false, err
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM bun_migrations").Scan(&n); err != nil {
		return false, err
	}
	return n > 0, nil
}

// Notifies reports whether db announces changes to listeners (Listen):
// PostgreSQL's LISTEN/NOTIFY. SQLite has no way to wake another process;
// there a caller relies on its periodic sweep.
func Notifies(db *bun.DB) bool { return postgres(db) }

// Listen calls ready once it listens on channel, then onNotify for every
// notification on it, until ctx ends or the connection is lost (the
// error). It needs Notifies(db).
func Listen(ctx context.Context, db *bun.DB, channel string, ready, onNotify func()) error {
	if !Notifies(db) {
		return fmt.Errorf("listen %s: %s has no notifications", channel, db.Dialect().Name())
	}
	conn, err := db.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		pc, ok := PgxConn(dc)
		if !ok {
			return fmt.Errorf("not a pgx connection: %T", dc)
		}
		if _, err := pc.Exec(ctx, "LISTEN "+channel); err != nil {
			return err
		}
		ready()
		for {
			if _, err := pc.WaitForNotification(ctx); err != nil {
				if ctx.Err() != nil {
					// The connection is mid-wait: it cannot go back to the pool.
					return driver.ErrBadConn
				}
				return err
			}
			onNotify()
		}
	})
}

// A LiveLock is held by a process for as long as it lives, so that others
// see at once that it died (NotLive), without waiting for its leases to
// pass: a PostgreSQL session advisory lock (ns, hashtext(name)) on a
// connection of its own, which PostgreSQL frees when the connection
// closes, as it does when the process dies. SQLite is one process's file:
// there is no other process to tell, and a LiveLock holds nothing.
type LiveLock struct {
	db   *bun.DB
	ns   int32
	name string

	mu   sync.Mutex
	conn *sql.Conn
	ping time.Time
}

// NewLiveLock returns the (not yet held) liveness lock of name in the
// namespace ns.
func NewLiveLock(db *bun.DB, ns int32, name string) *LiveLock {
	return &LiveLock{db: db, ns: ns, name: name}
}

// Hold takes the lock, or checks every few seconds that its connection
// still holds it (taking it again when not). Errors are left to the next
// call: meanwhile the caller's leases still hold.
func (l *LiveLock) Hold(ctx context.Context) {
	if !postgres(l.db) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		if time.Since(l.ping) < 2*time.Second {
			return
		}
		if err := l.conn.PingContext(ctx); err == nil {
			l.ping = time.Now()
			return
		}
		dropConn(l.conn)
		l.conn = nil
	}
	c, err := l.db.DB.Conn(ctx)
	if err != nil {
		return
	}
	if _, err := c.ExecContext(ctx, "SELECT pg_advisory_lock($1, hashtext($2))", l.ns, l.name); err != nil {
		dropConn(c)
		return
	}
	l.conn, l.ping = c, time.Now()
}

// Release frees the lock: unlocked first, so that others see it free at
// once (the server ends a closed connection's session, and with it the
// lock, only a moment later), then its connection is closed, not returned
// to the pool.
func (l *LiveLock) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		l.conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1, hashtext($2))", l.ns, l.name) //nolint:errcheck
		cancel()
		dropConn(l.conn)
		l.conn = nil
	}
}

// dropConn closes a connection rather than return it to the pool (with
// the lock it holds).
func dropConn(c *sql.Conn) {
	c.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck
	c.Close()
}

// NotLive is a condition, for a WHERE of db, that no process holds the
// LiveLock of namespace ns named by column (an SQL expression), and
// whether db can tell at all (false on SQLite: there the caller waits for
// leases to pass).
func NotLive(db bun.IDB, column string, ns int32) (cond string, args []any, ok bool) {
	if !postgres(db) {
		return "", nil, false
	}
	// pg_locks shows a two-key advisory lock as classid = the first key,
	// objid = the second as an unsigned oid, objsubid = 2.
	return `NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid = ? AND l.objid = (hashtext(` + column + `)::bigint & 4294967295)::oid AND l.objsubid = 2)`, []any{ns}, true
}
