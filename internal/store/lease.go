package store

import (
	"time"

	"github.com/uptrace/bun"
)

// Leases (ADR 0952). A row that one process at a time works on (a
// background run it records, a webhook delivery it attempts) carries
// lease_owner, the process, and lease_until, when its claim ends unless
// renewed. A lease that ends at t is free at t: free means lease_until is
// NULL (never taken, or released) or not after now. Claiming several due
// rows at once goes through SkipLocked, so replicas take different rows.

// Lease is one owner's lease on rows: Owner names the process, Term is
// how long a claim or a renewal holds.
type Lease struct {
	Owner string
	Term  time.Duration
}

// LeaseFree is the condition, with its argument, that a row's lease is
// free at now; alias qualifies the column ("d": d.lease_until; "": none).
// For q.Where(store.LeaseFree("", now)) or a raw query's text.
func LeaseFree(alias string, now time.Time) (string, time.Time) {
	c := leaseUntil(alias)
	return "(" + c + " IS NULL OR " + c + " <= ?)", now
}

// LeaseHeld is the condition that a row's lease runs past now, whoever
// holds it: the opposite of LeaseFree.
func LeaseHeld(alias string, now time.Time) (string, time.Time) {
	return leaseUntil(alias) + " > ?", now
}

func leaseUntil(alias string) string {
	if alias == "" {
		return "lease_until"
	}
	return alias + ".lease_until"
}

// Take is the SET clause, with its arguments, that gives l the lease from
// now: q.Set(l.Take(now)), or a raw UPDATE's text.
func (l Lease) Take(now time.Time) (string, string, time.Time) {
	return "lease_owner = ?, lease_until = ?", l.Owner, l.Until(now)
}

// Until is when a lease taken or renewed at now ends.
func (l Lease) Until(now time.Time) time.Time { return now.Add(l.Term) }

// Mine is the condition that l holds a row's lease: it took it and no one
// took it since (it may have ended or been released).
func (l Lease) Mine() (string, string) { return "lease_owner = ?", l.Owner }

// Extend renews, for a Term from now, the lease l holds on the rows q
// updates (RowsAffected 0: another took it).
func (l Lease) Extend(q *bun.UpdateQuery, now time.Time) *bun.UpdateQuery {
	return q.Set("lease_until = ?", l.Until(now)).Where(l.Mine())
}

// Release ends now the lease l holds on the rows q updates: it has no end
// (NULL), so it is free at once whatever the clock of the process that
// looks next. The owner stays named; a table whose owner column means "an
// attempt in flight" clears it too.
func (l Lease) Release(q *bun.UpdateQuery) *bun.UpdateQuery {
	return q.Set("lease_until = NULL").Where(l.Mine())
}
