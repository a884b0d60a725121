package federation_test

import (
	"context"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// TestNoTokenWithoutItsAuditRow: an exchange that passes every check but
// whose audit row cannot be written hands out no token: 503
// temporarily_unavailable, no access token in the body.
func TestNoTokenWithoutItsAuditRow(t *testing.T) {
	p := newIDP(t)
	f := newFed(t, storetest.SQLite(t), p)
	issued(t, f.exchange(t, p.token(t, kidRSA, p.claims()))) // the path works
	if _, err := f.DB.ExecContext(context.Background(), "ALTER TABLE federation_exchanges RENAME TO federation_exchanges_gone"); err != nil {
		t.Fatal(err)
	}
	a := f.exchange(t, p.token(t, kidRSA, p.claims()))
	expectError(t, a, http.StatusServiceUnavailable, "temporarily_unavailable")
	if strings.Contains(a.body, "access_token") || !strings.Contains(a.body, "could not be recorded") {
		t.Fatalf("answer without an audit row: %s", a.body)
	}
}

// TestAuditWriterEndsAtClose: the audit's writer, started by the first
// exchange, ends when the service closes, after writing what was queued;
// an exchange after Close hands out no token (503), as one whose row
// cannot be written.
func TestAuditWriterEndsAtClose(t *testing.T) {
	p := newIDP(t)
	f := newFed(t, storetest.SQLite(t), p)
	issued(t, f.exchange(t, p.token(t, kidRSA, p.claims())))
	const writer = "federation.(*auditWriter).loop"
	if !strings.Contains(allStacks(), writer) {
		t.Fatal("no audit writer running after an exchange")
	}
	f.Server.Federation.Close()
	if s := allStacks(); strings.Contains(s, writer) {
		t.Fatalf("the audit writer outlived Close:\n%s", s)
	}
	var n int
	if err := f.DB.NewSelect().Table("federation_exchanges").ColumnExpr("count(*)").Scan(context.Background(), &n); err != nil || n != 1 {
		t.Fatalf("audit rows after Close: %d, %v", n, err)
	}
	a := f.exchange(t, p.token(t, kidRSA, p.claims()))
	expectError(t, a, http.StatusServiceUnavailable, "temporarily_unavailable")
}

func allStacks() string {
	b := make([]byte, 1<<20)
	return string(b[:runtime.Stack(b, true)])
}
