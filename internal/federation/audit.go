package federation

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"google.golang.org/protobuf/types/known/timestamppb"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/store"
)

// auditWriter writes exchange audit rows by group commit: an exchange
// queues its row and waits until the transaction that holds it has
// committed, so no token leaves before its audit row is durable (a crash
// used to lose up to 200 ms of issued tokens' rows). One goroutine
// writes; the rows that arrive while it writes share the next
// transaction, so under load one commit serves many exchanges and the
// cost per row stays that of a batched INSERT (docs/benchmarks.md).
//
// The queue is a slice under a mutex, not a channel: a send on a channel
// per row wakes the writer for every row; here it wakes once per batch.
type auditWriter struct {
	s *Service

	once    sync.Once
	mu      sync.Mutex
	pending []*store.FederationExchange
	batch   *auditCommit  // what the pending rows' writers wait on
	wake    chan struct{} // rows are pending (capacity 1); closed by close
	closed  bool
	stopped chan struct{} // closed when the writer has ended

	stmt      preparedStmt // one row
	chunkStmt preparedStmt // auditChunk rows
}

// auditCommit is one transaction of audit rows: done closes once it has
// committed (err nil) or failed.
type auditCommit struct {
	done chan struct{}
	err  error
}

func (a *auditWriter) start() {
	a.once.Do(func() {
		a.wake, a.stopped = make(chan struct{}, 1), make(chan struct{})
		go a.loop()
	})
}

// errAuditClosed: the service is closing; an exchange gets no token
// without its row.
var errAuditClosed = errors.New("federation: the exchange audit is closed")

// close writes what is queued and ends the writer; a record after it
// fails.
func (a *auditWriter) close() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	started := a.wake != nil
	if started {
		close(a.wake)
	}
	a.mu.Unlock()
	if started {
		<-a.stopped
	}
}

// record writes rec in the next transaction and returns once it has
// committed; an error means the row may not be there.
func (a *auditWriter) record(ctx context.Context, rec *store.FederationExchange) error {
	a.start()
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return errAuditClosed
	}
	a.pending = append(a.pending, rec)
	if a.batch == nil {
		a.batch = &auditCommit{done: make(chan struct{})}
	}
	c := a.batch
	// Under the lock: close may not close wake meanwhile.
	select {
	case a.wake <- struct{}{}:
	default:
	}
	a.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *auditWriter) loop() {
	defer close(a.stopped)
	for range a.wake {
		a.mu.Lock()
		rows, c := a.pending, a.batch
		a.pending, a.batch = nil, nil
		a.mu.Unlock()
		if c == nil {
			continue
		}
		// The rows' exchanges may be gone; their rows are written anyway.
		c.err = a.insert(context.Background(), rows)
		if c.err != nil {
			a.s.log().Error("federation: writing the exchange audit failed", "rows", len(rows), "err", c.err)
		}
		close(c.done)
	}
}

// auditChunk is how many rows one prepared INSERT writes: executing a
// statement costs more than the rows it writes, so a batch is a few
// multi-row executions in one transaction, prepared once.
const auditChunk = 32

// auditInsert is the INSERT of n rows with db's placeholders.
func auditInsert(db bun.IDB, n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO federation_exchanges (id, organization_id, policy_id, issuer_id, at, outcome, failed_check,
		detail, subject, source_address, token_id, api_key_id) VALUES `)
	p := 0
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for j := range 12 {
			if j > 0 {
				b.WriteString(", ")
			}
			p++
			b.WriteString(store.Placeholder(db, p))
		}
		b.WriteByte(')')
	}
	return b.String()
}

func (a *auditWriter) insert(ctx context.Context, rows []*store.FederationExchange) error {
	one, err := a.stmt.get(ctx, a.s.DB.DB, auditInsert(a.s.DB, 1))
	if err != nil {
		return err
	}
	many, err := a.chunkStmt.get(ctx, a.s.DB.DB, auditInsert(a.s.DB, auditChunk))
	if err != nil {
		return err
	}
	tx, err := a.s.DB.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	args := make([]any, 0, 12*auditChunk)
	for len(rows) > 0 {
		n := min(len(rows), auditChunk)
		stmt := many
		if n < auditChunk {
			n, stmt = 1, one
		}
		args = args[:0]
		for _, r := range rows[:n] {
			// As bun would write it: bun reads and compares it.
			args = append(args, r.ID, r.OrganizationID, r.PolicyID, r.IssuerID, store.TimeArg(a.s.DB, r.At), r.Outcome, r.FailedCheck,
				r.Detail, r.Subject, r.SourceAddress, r.TokenID, r.APIKeyID)
		}
		if _, err := tx.StmtContext(ctx, stmt).ExecContext(ctx, args...); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return tx.Commit()
}

// flush returns once every row queued before it has been written.
func (a *auditWriter) flush(ctx context.Context) {
	a.mu.Lock()
	c := a.batch
	a.mu.Unlock()
	if c == nil {
		return
	}
	select {
	case <-c.done:
	case <-ctx.Done():
	}
}

// FlushAudit writes queued audit rows now (tests and the benchmark use it).
func (s *Service) FlushAudit(ctx context.Context) { s.audit.flush(ctx) }

// Page bounds of ListExchanges.
const (
	defaultExchangePage = 50
	maxExchangePage     = 200
)

// ExchangeProto converts a row.
func ExchangeProto(r *store.FederationExchange) *cohortv1.Exchange {
	return &cohortv1.Exchange{Id: r.ID, Time: timestamppb.New(r.At), PolicyId: r.PolicyID, IssuerId: r.IssuerID,
		Outcome: r.Outcome, FailedCheck: r.FailedCheck, Detail: r.Detail, Subject: r.Subject,
		SourceAddress: r.SourceAddress, TokenId: r.TokenID, ApiKeyId: r.APIKeyID}
}

// ListExchanges lists the organization's audited exchanges, newest first.
func (s *Service) ListExchanges(ctx context.Context, p *auth.Principal, req *cohortv1.ListExchangesRequest) (*cohortv1.ListExchangesResponse, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size == 0:
		size = defaultExchangePage
	case size < 0 || size > maxExchangePage:
		return nil, apierr.BadRequest("page_size must be between 1 and %d", maxExchangePage)
	}
	s.audit.flush(ctx)
	var rows []store.FederationExchange
	q := s.DB.NewSelect().Model(&rows).Where("organization_id = ?", p.OrganizationID).
		OrderExpr("at DESC, id DESC").Limit(int64(size + 1))
	if req.GetPolicyId() != "" {
		q = q.Where("policy_id = ?", req.GetPolicyId())
	}
	if tok := req.GetPageToken(); tok != "" {
		at, id, err := decodePageToken(tok)
		if err != nil {
			return nil, err
		}
		q = q.Where("(at < ? OR (at = ? AND id < ?))", at, at, id)
	}
	if err := q.Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	out := &cohortv1.ListExchangesResponse{}
	for i := range rows {
		if i == size {
			last := rows[size-1]
			out.NextPageToken = base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%d|%s", last.At.UnixMicro(), last.ID))
			break
		}
		out.Exchanges = append(out.Exchanges, ExchangeProto(&rows[i]))
	}
	return out, nil
}

func decodePageToken(tok string) (time.Time, string, error) {
	bad := apierr.BadRequest("page_token is not one this service issued")
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, "", bad
	}
	micros, id, ok := strings.Cut(string(b), "|")
	if !ok {
		return time.Time{}, "", bad
	}
	var us int64
	if _, err := fmt.Sscanf(micros, "%d", &us); err != nil {
		return time.Time{}, "", bad
	}
	return time.UnixMicro(us).UTC(), id, nil
}

// newExchangeID is a time-ordered UUID (version 7): audit rows are
// appended at the end of the primary key's B-tree instead of at random
// places, which keeps the audit write cheap.
func newExchangeID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return id.String()
}
