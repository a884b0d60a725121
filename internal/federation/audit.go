package federation

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/uptrace/bun/dialect"
	"google.golang.org/protobuf/types/known/timestamppb"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/store"
)

// auditWriter writes exchange audit rows in batches from one goroutine. An
// exchange only queues its row: a database write per exchange would cost
// more than the exchange's cryptography (docs/benchmarks.md). Rows are
// written within auditFlushEvery, on Close, and before every read of the
// audit; when the queue is full the exchange writes its row itself, so a
// burst slows exchanges down rather than losing rows.
//
// The queue is a slice under a mutex, not a channel: a send on a channel
// wakes the writer for every row, and that wake-up (a futex call and a
// trip through the scheduler) cost more than the row's share of the
// batched INSERT. The writer wakes on its ticker, when a batch is full, or
// for a flush.
type auditWriter struct {
	s *Service

	once    sync.Once
	mu      sync.Mutex
	pending []*store.FederationExchange
	full    chan struct{} // a batch is waiting (capacity 1)
	flushes chan chan struct{}

	stmt      preparedStmt // one row
	chunkStmt preparedStmt // auditChunk rows
}

const (
	auditQueue      = 4096
	auditBatch      = 256
	auditFlushEvery = 200 * time.Millisecond
)

func (a *auditWriter) start() {
	a.once.Do(func() {
		a.full = make(chan struct{}, 1)
		a.flushes = make(chan chan struct{})
		go a.loop()
	})
}

func (a *auditWriter) record(ctx context.Context, rec *store.FederationExchange) {
	a.start()
	a.mu.Lock()
	n := len(a.pending)
	if n < auditQueue {
		a.pending = append(a.pending, rec)
	}
	a.mu.Unlock()
	switch {
	case n >= auditQueue:
		a.write(ctx, []*store.FederationExchange{rec})
	case n+1 == auditBatch:
		select {
		case a.full <- struct{}{}:
		default:
		}
	}
}

// take returns the queued rows and empties the queue; spare is the
// writer's previous batch, reused as the next queue.
func (a *auditWriter) take(spare []*store.FederationExchange) []*store.FederationExchange {
	clear(spare)
	a.mu.Lock()
	rows := a.pending
	a.pending = spare[:0]
	a.mu.Unlock()
	return rows
}

func (a *auditWriter) loop() {
	t := time.NewTicker(auditFlushEvery)
	defer t.Stop()
	var spare []*store.FederationExchange
	// drain writes what is queued now; rows queued meanwhile wait for the
	// next wake-up (a flush asks only for the rows queued before it).
	drain := func() {
		batch := a.take(spare)
		for rows := batch; len(rows) > 0; {
			n := min(len(rows), auditBatch)
			a.write(context.Background(), rows[:n])
			rows = rows[n:]
		}
		spare = batch
	}
	for {
		select {
		case <-a.full:
			drain()
		case <-t.C:
			drain()
		case done := <-a.flushes:
			drain()
			close(done)
		}
	}
}

// auditChunk is how many rows one prepared INSERT writes: executing a
// statement costs more than the rows it writes, so a batch is a few
// multi-row executions in one transaction, prepared once.
const auditChunk = 32

// auditInsert is the INSERT of n rows with the dialect's placeholders.
func auditInsert(pg bool, n int) string {
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
			if pg {
				fmt.Fprintf(&b, "$%d", p)
			} else {
				b.WriteByte('?')
			}
		}
		b.WriteByte(')')
	}
	return b.String()
}

func (a *auditWriter) write(ctx context.Context, rows []*store.FederationExchange) {
	if err := a.insert(ctx, rows); err != nil {
		a.s.log().ErrorContext(ctx, "federation: writing the exchange audit failed", "rows", len(rows), "err", err)
	}
}

func (a *auditWriter) insert(ctx context.Context, rows []*store.FederationExchange) error {
	pg := a.s.DB.Dialect().Name() == dialect.PG
	one, err := a.stmt.get(ctx, a.s.DB.DB, auditInsert(pg, 1))
	if err != nil {
		return err
	}
	many, err := a.chunkStmt.get(ctx, a.s.DB.DB, auditInsert(pg, auditChunk))
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
			// On SQLite a timestamp is text; write it exactly as bun
			// does, so bun's reads and comparisons ("at < ?") see one
			// format.
			var at any = r.At
			if !pg {
				at = r.At.UTC().Format("2006-01-02 15:04:05.999999-07:00")
			}
			args = append(args, r.ID, r.OrganizationID, r.PolicyID, r.IssuerID, at, r.Outcome, r.FailedCheck,
				r.Detail, r.Subject, r.SourceAddress, r.TokenID, r.APIKeyID)
		}
		if _, err := tx.StmtContext(ctx, stmt).ExecContext(ctx, args...); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return tx.Commit()
}

// flush writes every queued row before it returns.
func (a *auditWriter) flush(ctx context.Context) {
	a.start()
	done := make(chan struct{})
	select {
	case a.flushes <- done:
	case <-ctx.Done():
		return
	}
	select {
	case <-done:
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
