package federation_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/storetest"
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
