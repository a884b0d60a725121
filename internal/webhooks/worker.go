package webhooks

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/store"
)

// Delivery defaults (ADR 0034).
const (
	// DefaultAttemptTimeout bounds one attempt (Standard Webhooks
	// receivers are told to answer fast and work later).
	DefaultAttemptTimeout = 15 * time.Second
	// DefaultConcurrency is how many attempts one worker makes at once.
	DefaultConcurrency = 64
	// DefaultPerWorkspace is how many of them may be one workspace's: a
	// workspace whose receivers are slow holds at most these slots, and
	// every other workspace's deliveries go out in the rest.
	DefaultPerWorkspace = 8
	// DefaultBatch is the most deliveries one claim takes.
	DefaultBatch = 16
	// DefaultLease is how long a claimed delivery is a worker's before
	// another may take it: longer than an attempt, so a live worker
	// always finishes first; a killed one's deliveries are retried once
	// it runs out.
	DefaultLease = time.Minute
	// DefaultPoll is how often an idle worker looks for due deliveries.
	DefaultPoll = 500 * time.Millisecond
	// MaxRetryAfter caps how far a receiver's Retry-After pushes the next
	// attempt.
	MaxRetryAfter = 6 * time.Hour
	// MaxResponseBody bounds what is read of an answer (then the
	// connection is dropped rather than drained).
	MaxResponseBody = 64 << 10
	// maxErrorText bounds the answer's excerpt kept as last_error.
	maxErrorText = 200
	// DefaultRetention is how long finished deliveries stay in the log.
	DefaultRetention = 30 * 24 * time.Hour
	// pruneEvery is how often a worker deletes expired log rows.
	pruneEvery = 10 * time.Minute
	// UserAgent identifies deliveries.
	UserAgent = "Cohort-Webhooks/1"
)

// DefaultSchedule is the wait after each failed attempt: exponential from
// 5 s to 8 h, 11 attempts over about 24 h 12 m, each wait jittered by
// ±25%; after the last the delivery is failed (and may be redelivered).
var DefaultSchedule = []time.Duration{5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute,
	30 * time.Minute, time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour, 8 * time.Hour}

// Worker drains the outbox: it claims due deliveries with a lease
// (PostgreSQL: FOR UPDATE SKIP LOCKED, so replicas take different rows;
// SQLite: one UPDATE under its single writer), sends each, and records the
// answer or the next attempt. Every replica runs one; each delivery is
// attempted by one worker at a time.
//
// It is fair per workspace: it makes at most Concurrency attempts at once,
// at most PerWorkspace of them for one workspace, and claims again as soon
// as a slot frees (no batch waits for its slowest member). A claim skips
// the workspaces already at their bound and prefers the ones with the
// fewest attempts in flight, so one workspace's slow receivers delay only
// that workspace's deliveries.
type Worker struct {
	DB     *bun.DB
	KEK    *envelope.KEK
	Client *http.Client
	Log    *slog.Logger
	// Now is the clock (tests); nil is the wall clock.
	Now func() time.Time
	// Zero fields take the defaults above. Batch is the most one claim
	// takes; Concurrency the most attempts in flight; PerWorkspace the
	// most of those for one workspace. AttemptTimeout bounds an attempt
	// (besides the client's own timeout): keep it well inside Lease.
	Lease          time.Duration
	Poll           time.Duration
	Schedule       []time.Duration
	Batch          int
	Concurrency    int
	PerWorkspace   int
	AttemptTimeout time.Duration
	// Retention bounds the delivery log: succeeded and failed deliveries
	// older than this are deleted (pending ones never are).
	Retention time.Duration
	// Jitter returns a factor for a scheduled wait; nil is uniform in
	// [0.75, 1.25).
	Jitter func() float64
	// OnDelivered, when set, is called after each successful attempt
	// (benchmarks measure latency from it).
	OnDelivered func(id string, created, delivered time.Time)
	// Observe, when set, counts each attempt by outcome (succeeded, retry,
	// failed: the last attempt failed) with its duration (the metrics).
	Observe func(outcome string, took time.Duration)

	once sync.Once
	id   string
	wake chan struct{}
	done chan struct{}
	// freed is signalled when an attempt in flight has been recorded.
	freed chan struct{}

	// claiming serializes claims (Run's, and RunOnce's in tests).
	claiming sync.Mutex
	mu       sync.Mutex
	// inflight counts the attempts in flight per workspace; total all.
	inflight map[string]int
	total    int
	running  sync.WaitGroup

	// A failed attempt is logged at most once per failLogEvery; the
	// lines left out are counted into the next.
	failMu     sync.Mutex
	failLogged time.Time
	failQuiet  int
}

const failLogEvery = 10 * time.Second

func (w *Worker) init() {
	w.once.Do(func() {
		b := make([]byte, 8)
		rand.Read(b)
		w.id = "wk_" + hex.EncodeToString(b)
		w.wake = make(chan struct{}, 1)
		w.done = make(chan struct{})
		if w.Lease <= 0 {
			w.Lease = DefaultLease
		}
		if w.Poll <= 0 {
			w.Poll = DefaultPoll
		}
		if w.Schedule == nil {
			w.Schedule = DefaultSchedule
		}
		w.freed = make(chan struct{}, 1)
		w.inflight = map[string]int{}
		// A claim never takes more than the free slots, so every claimed
		// delivery is attempted at once and ends within one attempt
		// timeout of its claim: well inside the lease.
		if w.Batch <= 0 {
			w.Batch = DefaultBatch
		}
		if w.Concurrency <= 0 {
			w.Concurrency = DefaultConcurrency
		}
		if w.PerWorkspace <= 0 {
			w.PerWorkspace = DefaultPerWorkspace
		}
		w.PerWorkspace = min(w.PerWorkspace, w.Concurrency)
		if w.AttemptTimeout <= 0 {
			w.AttemptTimeout = DefaultAttemptTimeout
		}
		if w.Retention <= 0 {
			w.Retention = DefaultRetention
		}
		if w.Client == nil {
			w.Client = NewClient(ClientOptions{})
		}
		if w.Log == nil {
			w.Log = slog.New(slog.DiscardHandler)
		}
		if w.AttemptTimeout >= w.Lease {
			w.Log.Warn("webhooks: the lease is not longer than an attempt; a delivery may be sent twice",
				"lease", w.Lease, "attempt_timeout", w.AttemptTimeout)
		}
	})
}

func (w *Worker) now() time.Time { return store.Now(w.Now) }

// lease is this worker's lease on the deliveries it attempts (ADR 0952).
func (w *Worker) lease() store.Lease { return store.Lease{Owner: w.id, Term: w.Lease} }

// Wake asks the worker to look for due deliveries now.
func (w *Worker) Wake() {
	w.init()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Run drains the outbox until ctx ends: it claims due deliveries whenever
// slots are free (woken, at every poll, and as soon as an attempt ends
// while deliveries may be waiting for a slot) and attempts each at once.
// When ctx ends the attempts in flight are finished (each bounded by the
// attempt timeout) and recorded, so a graceful stop sends nothing twice;
// Done says when. A process killed meanwhile leaves its leases to run
// out: another worker (or this one after a restart) sends those
// deliveries again. A claim that fails is logged and tried again; Run
// returns nil when ctx ends (the gateway's loops, ADR 0971).
func (w *Worker) Run(ctx context.Context) error {
	w.init()
	defer close(w.done)
	defer w.running.Wait()
	tick := time.NewTicker(w.Poll)
	defer tick.Stop()
	var pruned time.Time
	fill, fresh, waiting := true, true, false
	for {
		if time.Since(pruned) > pruneEvery {
			pruned = time.Now()
			if _, err := w.Prune(ctx); err != nil && ctx.Err() == nil {
				w.Log.Warn("webhooks: prune the delivery log", "error", err)
			}
		}
		if fill {
			waiting = w.fill(ctx, fresh)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			fill, fresh = true, true
		case <-w.wake:
			fill, fresh = true, true
		case <-w.freed:
			// A slot freed: claim again only when something may be
			// waiting for it (every slot was taken, or a workspace was
			// at its bound, when the last claim ended); otherwise the
			// poll and Wake are enough.
			fill, fresh = waiting, false
		}
	}
}

// fill claims due deliveries into the free slots and starts them, again
// while a claim was full. It reports whether deliveries may be waiting
// for a slot (every slot was taken, or a workspace was at its bound): then
// Run claims again as soon as one frees.
//
// A claim that took a workspace to its bound may have left another
// workspace's due deliveries behind that workspace's among its
// candidates. After a Wake or a poll (fresh events, perhaps another
// workspace's) fill claims once more at once, skipping it. After a freed
// slot it does not (that claim would read past the due backlog of the
// workspace at its bound at every refill): the next Wake or poll does.
func (w *Worker) fill(ctx context.Context, fresh bool) bool {
	for ctx.Err() == nil {
		c, err := w.claimStart(ctx, func(err error) {
			w.Log.Warn("webhooks: outbox", "error", err)
		})
		if err != nil {
			if ctx.Err() == nil {
				w.Log.Warn("webhooks: outbox", "error", err)
			}
			return false
		}
		switch {
		case c.limit == 0:
			return true
		case c.n == c.limit:
		case c.reached && fresh:
			fresh = false
		default:
			return c.capped
		}
	}
	return false
}

// Prune deletes finished deliveries older than the retention; it returns
// how many.
func (w *Worker) Prune(ctx context.Context) (int64, error) {
	w.init()
	res, err := w.DB.NewDelete().Model((*store.WebhookDelivery)(nil)).
		Where("status IN (?, ?) AND created_at < ?", store.WebhookSucceeded, store.WebhookFailed, w.now().Add(-w.Retention)).Exec(ctx)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// claimed is a delivery this worker holds.
type claimed struct {
	ID          string    `bun:"id"`
	WorkspaceID string    `bun:"workspace_id"`
	EndpointID  string    `bun:"endpoint_id"`
	Payload     string    `bun:"payload"`
	Attempts    int       `bun:"attempts"`
	CreatedAt   time.Time `bun:"created_at"`
}

// Done is closed when Run has returned.
func (w *Worker) Done() <-chan struct{} {
	w.init()
	return w.done
}

// RunOnce claims one batch of due deliveries (as many as the free slots
// and the per-workspace bound allow), attempts them, and records the
// outcomes; it returns how many it claimed. Once claimed, a batch is
// finished even if ctx ends. Run does not wait for batches; RunOnce is
// for tests and benchmarks.
func (w *Worker) RunOnce(ctx context.Context) (int, error) {
	w.init()
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	c, err := w.claimStart(ctx, func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}, &wg)
	wg.Wait()
	if err != nil {
		return c.n, err
	}
	return c.n, first
}

// claimResult is what claimStart did: it claimed n of the limit it asked
// for (0 when no slot was free); capped says a workspace was at its bound
// once the claim was made (the claim skipped it, or it reached it),
// reached that one reached it in this claim.
type claimResult struct {
	n, limit        int
	capped, reached bool
}

// claimStart claims due deliveries into the free slots and starts an
// attempt for each. failed is called with the error of an attempt that
// could not be recorded; wg, if given, is done when the attempts are.
func (w *Worker) claimStart(ctx context.Context, failed func(error), wg ...*sync.WaitGroup) (c claimResult, err error) {
	w.claiming.Lock()
	defer w.claiming.Unlock()
	w.mu.Lock()
	c.limit = min(w.Concurrency-w.total, w.Batch)
	held := make(map[string]int, len(w.inflight))
	for ws, k := range w.inflight {
		held[ws] = k
	}
	w.mu.Unlock()
	if c.limit <= 0 {
		return claimResult{capped: true}, nil
	}
	rows, err := w.claim(ctx, w.now(), c.limit, held)
	if err != nil {
		return c, err
	}
	for _, r := range rows {
		if held[r.WorkspaceID]++; held[r.WorkspaceID] >= w.PerWorkspace {
			c.reached = true
		}
	}
	for _, k := range held {
		c.capped = c.capped || k >= w.PerWorkspace
	}
	c.n = len(rows)
	if c.n == 0 {
		return c, nil
	}
	ctx = context.WithoutCancel(ctx)
	eps, err := w.endpoints(ctx, rows)
	if err != nil {
		// Claimed but not attempted: the leases run out and the
		// deliveries are attempted again then.
		return c, err
	}
	w.mu.Lock()
	for _, r := range rows {
		w.inflight[r.WorkspaceID]++
		w.total++
	}
	w.mu.Unlock()
	for _, g := range wg {
		g.Add(len(rows))
	}
	w.running.Add(len(rows))
	for _, r := range rows {
		go func() {
			defer func() {
				w.release(r.WorkspaceID)
				w.running.Done()
				for _, g := range wg {
					g.Done()
				}
			}()
			if err := w.deliver(ctx, r, eps[r.EndpointID]); err != nil {
				failed(err)
			}
		}()
	}
	return c, nil
}

// release frees the slot of an attempt that has been recorded.
func (w *Worker) release(ws string) {
	w.mu.Lock()
	if w.inflight[ws]--; w.inflight[ws] <= 0 {
		delete(w.inflight, ws)
	}
	w.total--
	w.mu.Unlock()
	select {
	case w.freed <- struct{}{}:
	default:
	}
}

// claim takes up to limit due deliveries under a lease, at most
// PerWorkspace-held[ws] of workspace ws: among the first due deliveries
// of the workspaces under their bound, round-robin over the workspaces,
// those with the fewest attempts in flight first, each workspace's in due
// order.
func (w *Worker) claim(ctx context.Context, now time.Time, limit int, held map[string]int) ([]claimed, error) {
	// held as an expression over d.workspace_id.
	heldSQL, heldArgs := "0", []any(nil)
	if len(held) > 0 {
		var b strings.Builder
		b.WriteString("CASE d.workspace_id")
		for ws, k := range held {
			b.WriteString(" WHEN ? THEN ?")
			heldArgs = append(heldArgs, ws, k)
		}
		b.WriteString(" ELSE 0 END")
		heldSQL = b.String()
	}
	// Replicas claiming at once skip each other's rows.
	lock := store.SkipLocked(w.DB, "d")
	take, owner, until := w.lease().Take(now)
	freeD, _ := store.LeaseFree("d", now)
	free, _ := store.LeaseFree("", now)
	// The candidates: the first due deliveries, in due order, of the
	// workspaces under their bound; twice the claim, so a workspace with
	// many due rarely hides the others (and a later claim, once it is at
	// its bound, skips it).
	scan := 2 * limit
	args := []any{owner, until, now}
	args = append(args, heldArgs...)
	args = append(args, store.WebhookPending, now, now, true)
	args = append(args, heldArgs...)
	args = append(args, w.PerWorkspace, scan, w.PerWorkspace, limit, store.WebhookPending, now)
	var rows []claimed
	err := w.DB.NewRaw(`UPDATE webhook_deliveries SET `+take+`, attempts = attempts + 1, last_attempt_at = ?
		WHERE id IN (SELECT r.id FROM (
			SELECT c.id, c.next_attempt_at, c.held + ROW_NUMBER() OVER (PARTITION BY c.workspace_id ORDER BY c.next_attempt_at, c.id) AS slot
			FROM (SELECT d.id, d.workspace_id, d.next_attempt_at, `+heldSQL+` AS held FROM webhook_deliveries d
				WHERE d.status = ? AND d.next_attempt_at <= ? AND `+freeD+`
				AND d.endpoint_id IN (SELECT e.id FROM webhook_endpoints e WHERE e.enabled = ?)
				AND `+heldSQL+` < ?
				ORDER BY d.next_attempt_at LIMIT ?`+lock+`) c) r
			WHERE r.slot <= ? ORDER BY r.slot, r.next_attempt_at LIMIT ?)
		AND status = ? AND `+free+`
		RETURNING id, workspace_id, endpoint_id, payload, attempts, created_at`, args...).Scan(ctx, &rows)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return rows, nil
}

// target is where and how one endpoint's deliveries go.
type target struct {
	url  string
	keys [][]byte
	err  error
}

func (w *Worker) endpoints(ctx context.Context, rows []claimed) (map[string]*target, error) {
	ids := make([]string, 0, len(rows))
	for _, r := range rows {
		ids = append(ids, r.EndpointID)
	}
	var eps []store.WebhookEndpoint
	if err := w.DB.NewSelect().Model(&eps).Where("id IN (?)", bun.List(ids)).Scan(ctx); err != nil {
		return nil, fmt.Errorf("endpoints: %w", err)
	}
	now := w.now()
	out := map[string]*target{}
	for _, e := range eps {
		t := &target{url: e.URL}
		k, err := w.unwrap(e.Secret, e.ID)
		if err != nil {
			t.err = err
		} else {
			t.keys = append(t.keys, k)
			if e.PreviousSecret != nil && e.PreviousUntil != nil && now.Before(*e.PreviousUntil) {
				if pk, err := w.unwrap(e.PreviousSecret, e.ID); err == nil {
					t.keys = append(t.keys, pk)
				}
			}
		}
		out[e.ID] = t
	}
	return out, nil
}

func (w *Worker) unwrap(wrapped []byte, id string) ([]byte, error) {
	if w.KEK == nil {
		return nil, errors.New("no key-encryption key")
	}
	secret, err := w.KEK.Unwrap(wrapped, secretAD(id))
	if err != nil {
		return nil, errors.New("the endpoint's secret does not unwrap with this key-encryption key")
	}
	return SecretKey(string(secret))
}

// outcome is one attempt's result.
type outcome struct {
	code       int
	errText    string
	retryAfter time.Duration
}

func (w *Worker) deliver(ctx context.Context, r claimed, t *target) error {
	var o outcome
	began := time.Now()
	switch {
	case t == nil:
		o.errText = "the endpoint was deleted"
	case t.err != nil:
		o.errText = t.err.Error()
	default:
		o = w.attempt(ctx, r, t)
	}
	took := time.Since(began)
	result, err := w.record(ctx, r, o)
	if err != nil {
		return err
	}
	if w.Observe != nil {
		w.Observe(result, took)
	}
	if result != "succeeded" {
		w.logFailure(r, o, result)
	}
	return nil
}

// logFailure says that an attempt failed, at most once per failLogEvery:
// a receiver that refuses connections otherwise shows only in the
// delivery log API. The endpoint by id, the status or the error; never
// the URL (it may hold credentials) or the payload.
func (w *Worker) logFailure(r claimed, o outcome, result string) {
	w.failMu.Lock()
	now := time.Now()
	if now.Sub(w.failLogged) < failLogEvery {
		w.failQuiet++
		w.failMu.Unlock()
		return
	}
	quiet := w.failQuiet
	w.failLogged, w.failQuiet = now, 0
	w.failMu.Unlock()
	w.Log.Warn("webhook delivery attempt failed", "endpoint", r.EndpointID, "delivery", r.ID, "attempt", r.Attempts,
		"status_code", o.code, "error", o.errText, "outcome", result, "failures_not_logged_since_last", quiet)
}

func (w *Worker) attempt(ctx context.Context, r claimed, t *target) outcome {
	ctx, cancel := context.WithTimeout(ctx, w.AttemptTimeout)
	defer cancel()
	ts := w.now()
	body := []byte(r.Payload)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(body))
	if err != nil {
		return outcome{errText: "invalid url"}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set(HeaderID, r.ID)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	req.Header.Set(HeaderSignature, Signatures(t.keys, r.ID, ts, body))
	res, err := w.Client.Do(req)
	if err != nil {
		return outcome{errText: attemptError(err)}
	}
	defer res.Body.Close()
	excerpt, _ := io.ReadAll(io.LimitReader(res.Body, MaxResponseBody))
	o := outcome{code: res.StatusCode}
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		return o
	}
	o.errText = "HTTP " + strconv.Itoa(res.StatusCode)
	if s := printable(excerpt); s != "" {
		o.errText += ": " + s
	}
	o.retryAfter = parseRetryAfter(res.Header.Get("Retry-After"), ts)
	return o
}

// attemptError says why an attempt got no answer, without the URL (it
// may carry a token of the receiver's).
func attemptError(err error) string {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			err = inner
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Client.Timeout") {
		return "timed out"
	}
	s := err.Error()
	if len(s) > maxErrorText {
		s = s[:maxErrorText]
	}
	return s
}

func printable(b []byte) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, string(b))
	s = strings.TrimSpace(s)
	if r := []rune(s); len(r) > maxErrorText {
		s = string(r[:maxErrorText]) + "…"
	}
	return s
}

// parseRetryAfter reads seconds or an HTTP date; 0 when absent or bad.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		d = time.Duration(min(n, int64(MaxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), MaxRetryAfter)
}

// record stores an attempt's outcome and returns it: succeeded, retry or
// failed (the last attempt).
func (w *Worker) record(ctx context.Context, r claimed, o outcome) (string, error) {
	now := w.now()
	result := "retry"
	// Only the claim this worker holds: a lease that ran out and was taken
	// by another worker is that worker's to record. A delivery's owner is
	// its attempt in flight: it goes with the lease.
	q := w.lease().Release(w.DB.NewUpdate().Model((*store.WebhookDelivery)(nil))).
		Set("lease_owner = NULL, last_status_code = ?, last_error = ?", o.code, o.errText).
		Where("id = ? AND attempts = ?", r.ID, r.Attempts)
	switch {
	case o.errText == "" && o.code >= 200 && o.code < 300:
		q = q.Set("status = ?, delivered_at = ?", store.WebhookSucceeded, now)
		result = "succeeded"
	case r.Attempts > len(w.Schedule):
		q = q.Set("status = ?", store.WebhookFailed)
		result = "failed"
	default:
		wait := w.Schedule[r.Attempts-1]
		j := 0.75 + mrand.Float64()/2
		if w.Jitter != nil {
			j = w.Jitter()
		}
		wait = time.Duration(float64(wait) * j)
		wait = max(wait, o.retryAfter)
		q = q.Set("next_attempt_at = ?", now.Add(wait))
	}
	if _, err := q.Exec(ctx); err != nil {
		return "", fmt.Errorf("record delivery %s: %w", r.ID, err)
	}
	if o.errText == "" && w.OnDelivered != nil {
		w.OnDelivered(r.ID, r.CreatedAt, now)
	}
	return result, nil
}
