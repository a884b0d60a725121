package federation

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"time"

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
type auditWriter struct {
	s *Service

	once    sync.Once
	queue   chan *store.FederationExchange
	flushes chan chan struct{}
}

const (
	auditQueue      = 4096
	auditBatch      = 256
	auditFlushEvery = 200 * time.Millisecond
)

func (a *auditWriter) start() {
	a.once.Do(func() {
		a.queue = make(chan *store.FederationExchange, auditQueue)
		a.flushes = make(chan chan struct{})
		go a.loop()
	})
}

func (a *auditWriter) record(ctx context.Context, rec *store.FederationExchange) {
	a.start()
	select {
	case a.queue <- rec:
	default:
		a.write(ctx, []*store.FederationExchange{rec})
	}
}

func (a *auditWriter) loop() {
	t := time.NewTicker(auditFlushEvery)
	defer t.Stop()
	batch := make([]*store.FederationExchange, 0, auditBatch)
	drain := func() {
		for {
			select {
			case rec := <-a.queue:
				batch = append(batch, rec)
				if len(batch) == auditBatch {
					a.write(context.Background(), batch)
					batch = batch[:0]
				}
			default:
				if len(batch) > 0 {
					a.write(context.Background(), batch)
					batch = batch[:0]
				}
				return
			}
		}
	}
	for {
		select {
		case rec := <-a.queue:
			batch = append(batch, rec)
			if len(batch) == auditBatch {
				a.write(context.Background(), batch)
				batch = batch[:0]
			}
		case <-t.C:
			drain()
		case done := <-a.flushes:
			drain()
			close(done)
		}
	}
}

func (a *auditWriter) write(ctx context.Context, rows []*store.FederationExchange) {
	if _, err := a.s.DB.NewInsert().Model(&rows).Exec(ctx); err != nil {
		a.s.log().ErrorContext(ctx, "federation: writing the exchange audit failed", "rows", len(rows), "err", err)
	}
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
