package runs

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/uptrace/bun"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/rest"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/turn"
)

// errLost: another gateway records the run now (its lease passed to it),
// or the run is no longer running.
var errLost = errors.New("runs: this gateway no longer records the run")

// segment is the start of one chat response of a run: its first batch
// records it (the start, or the continuation after an answer).
type segment struct {
	id      string
	created int64
	// resume: the run was paused and an answer continues it.
	resume bool
}

func terminal(status string) bool {
	return status == store.RunCompleted || status == store.RunFailed || status == store.RunCancelled
}

// record stores the chunks one daemon event made (ev nil: chunks the
// service made) and what they say of the run, in one transaction with the
// run's status change and its notification. It returns the run as
// recorded.
func (m *Manager) record(ctx context.Context, id string, ev *interndv1.RunEvent, chunks []*cohortv1.ChatCompletionChunk, seg *segment) (*store.Run, error) {
	var r store.Run
	var notify string
	var stored, dropped int
	err := m.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		notify, stored, dropped = "", 0, 0
		if err := store.ForUpdate(tx.NewSelect().Model(&r).Where("id = ?", id)).Scan(ctx); err != nil {
			return err
		}
		now := m.now()
		if seg != nil && seg.resume {
			if r.Status != store.RunPaused {
				return errLost
			}
			r.Status, r.Pending, r.PauseDeadline, r.LeaseOwner = store.RunRunning, "", nil, m.owner
		}
		if r.LeaseOwner != m.owner || r.Status != store.RunRunning {
			return errLost
		}
		if seg != nil {
			r.CompletionID, r.CompletionCreated, r.SegmentOpen = seg.id, seg.created, true
		}
		if ev != nil {
			r.DaemonSeq = int64(ev.GetSeq())
			if s := ev.GetStarted(); s != nil {
				r.SessionID, r.DaemonRunID = s.GetSessionId(), s.GetRunId()
			}
			if u := ev.GetUsage(); u != nil {
				r.Usage = usageOf(&cohortv1.ChatCompletionChunk{Usage: &cohortv1.ChatUsage{PromptTokens: u.GetPromptTokens(),
					CompletionTokens: u.GetCompletionTokens(), TotalTokens: u.GetTotalTokens(), Cost: u.Cost, CachedTokens: u.CachedTokens}})
			}
			if ia := ev.GetInteraction(); ia != nil && ia.GetDeadline() != nil {
				t := ia.GetDeadline().AsTime().UTC()
				r.PauseDeadline = &t
			}
		}
		var rows []store.RunEvent
		finish := ""
		for _, c := range chunks {
			data := sse.AppendChunk(nil, c)
			final := len(c.GetChoices()) == 0
			if !final {
				ch := c.GetChoices()[0]
				if ch.FinishReason != nil {
					finish = ch.GetFinishReason()
					if c.GetError() != nil {
						r.Error = errorOf(c.GetError())
					}
				}
				if len(ch.GetDelta().GetToolCalls()) > 0 {
					r.Pending = toolCallOf(data)
				}
			}
			// Past the cap only the chunks that end a response are kept:
			// a reader still learns how the run ended.
			if !final && finish == "" && r.EventBytes+int64(len(data)) > m.Config.MaxEventBytes {
				r.EventsTruncated = true
				dropped++
				continue
			}
			r.LastSeq++
			r.EventBytes += int64(len(data))
			rows = append(rows, store.RunEvent{RunID: id, Seq: r.LastSeq, Data: string(data)})
			if !final {
				continue
			}
			r.SegmentOpen = false
			switch finish {
			case "tool_calls":
				r.Status = store.RunPaused
				if r.CancelRequested {
					// Cancelled while it asked: the daemon's run is
					// cancelled after this commits (follow).
					r.Status, r.Error = store.RunCancelled, errorOf(&cohortv1.ChunkError{Code: http.StatusGone, Reason: string(apierr.ReasonRunEnded), Message: "the caller cancelled the run"})
				}
			case "stop":
				r.Status, r.Pending = store.RunCompleted, ""
				r.Usage = usageOf(c)
			default:
				r.Status, r.Pending = store.RunFailed, ""
				if r.CancelRequested {
					r.Status = store.RunCancelled
				}
			}
			if r.Status != store.RunPaused {
				r.PauseDeadline = nil
			}
			if terminal(r.Status) {
				r.EndedAt = &now
			}
			notify = "run." + r.Status
		}
		stored = len(rows)
		if len(rows) > 0 {
			if _, err := tx.NewInsert().Model(&rows).Exec(ctx); err != nil {
				return err
			}
		}
		lease := m.lease().Until(now)
		r.LeaseUntil, r.UpdatedAt = &lease, now
		if _, err := tx.NewUpdate().Model(&r).WherePK().Exec(ctx); err != nil {
			return err
		}
		return m.notify(ctx, tx, &r, notify)
	})
	if err != nil {
		return nil, err
	}
	m.bump(id)
	if notify != "" && m.Notifier != nil {
		m.Notifier.Notify()
	}
	if r.Status == store.RunPaused {
		select {
		case m.paused <- struct{}{}:
		default:
		}
	}
	if m.Observer != nil {
		m.Observer.RunEvents(stored, dropped)
		if notify != "" && terminal(r.Status) {
			m.Observer.RunEnded(r.Status, r.EndedAt.Sub(r.CreatedAt))
		}
	}
	return &r, nil
}

// notify tells the Notifier of a status change, in the transaction.
func (m *Manager) notify(ctx context.Context, tx bun.IDB, r *store.Run, eventType string) error {
	if eventType == "" || m.Notifier == nil {
		return nil
	}
	b, err := runJSON(r)
	if err != nil {
		return err
	}
	return m.Notifier.RunChanged(ctx, tx, r.WorkspaceID, eventType, b)
}

// usageOf is the usage object of a final chunk as the stream shows it,
// or "" when it carries none.
func usageOf(c *cohortv1.ChatCompletionChunk) string {
	if c.GetUsage() == nil {
		return ""
	}
	var top struct {
		Usage json.RawMessage `json:"usage"`
	}
	if json.Unmarshal(sse.AppendChunk(nil, c), &top) != nil {
		return ""
	}
	return string(top.Usage)
}

// toolCallOf is the tool call of a chunk (a pause's interaction).
func toolCallOf(data []byte) string {
	var c struct {
		Choices []struct {
			Delta struct {
				ToolCalls []json.RawMessage `json:"tool_calls"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &c) != nil || len(c.Choices) == 0 || len(c.Choices[0].Delta.ToolCalls) == 0 {
		return ""
	}
	return string(c.Choices[0].Delta.ToolCalls[0])
}

// errorOf is an error chunk's error as the spec's error object.
func errorOf(e *cohortv1.ChunkError) string {
	o := rest.ErrorObject{Code: int(e.GetCode()), Message: e.GetMessage()}
	if e.GetReason() != "" {
		o.Metadata = &rest.ErrorMetadata{Reason: e.GetReason()}
	}
	b, _ := json.Marshal(o)
	return string(b)
}

// usageFrom reads back a usage object usageOf wrote.
func usageFrom(s string) *cohortv1.ChatUsage {
	if s == "" {
		return nil
	}
	var u struct {
		Prompt     int64    `json:"prompt_tokens"`
		Completion int64    `json:"completion_tokens"`
		Total      int64    `json:"total_tokens"`
		Cost       *float64 `json:"cost"`
		Details    *struct {
			Cached int64 `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	if json.Unmarshal([]byte(s), &u) != nil {
		return nil
	}
	out := &cohortv1.ChatUsage{PromptTokens: u.Prompt, CompletionTokens: u.Completion, TotalTokens: u.Total, Cost: u.Cost}
	if u.Details != nil {
		out.CachedTokens = &u.Details.Cached
	}
	return out
}

// follow records the rest of a run's stream in the background, renewing
// the lease as it goes.
func (m *Manager) follow(ctx context.Context, cancel context.CancelFunc, id string, in *store.Intern, st *turn.Stream) {
	if !m.hold(ctx, cancel, id, func() { m.followStream(ctx, id, in, st) }) {
		st.Close()
	}
}

// hold runs work on its own goroutine while this process records run id:
// the lease is renewed from now until work returns (or another took the
// run: ctx is then cancelled). Once Close began it runs nothing, releases
// the run and returns false.
func (m *Manager) hold(ctx context.Context, cancel context.CancelFunc, id string, work func()) bool {
	m.mu.Lock()
	if m.ctx.Err() != nil {
		// Closed meanwhile: the run is another gateway's to take.
		m.mu.Unlock()
		cancel()
		m.release(id)
		return false
	}
	m.owned[id] = true
	m.wg.Add(1) // under mu: Close cancels under it, then waits
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			delete(m.owned, id)
			m.mu.Unlock()
		}()
		defer cancel()
		go m.heartbeat(ctx, cancel, id)
		work()
	}()
	return true
}

// followStream records a run's daemon stream to its end. A stream that
// ends by the gateway's own doing (a budget passed, the daemon's stream
// broke) leaves the daemon's detached run going: it is cancelled.
func (m *Manager) followStream(ctx context.Context, id string, in *store.Intern, st *turn.Stream) {
	defer st.Close()
	var last *store.Run
	cancelDaemon := false
	for {
		ev, chunks, err := st.NextEvent()
		if err != nil {
			if err != io.EOF {
				return // shutting down, or the lease was lost
			}
			break
		}
		r, err := m.recordRetry(ctx, id, ev, chunks)
		if err != nil {
			if !errors.Is(err, errLost) && ctx.Err() == nil {
				// Another pass (this gateway's or another's) takes the
				// run over from the last event recorded.
				m.Log.Error("record a background run; it will be taken over", "run", id, "err", err)
				m.release(id)
			}
			return
		}
		last = r
		if ev == nil && r.Status == store.RunFailed {
			cancelDaemon = true
		}
	}
	if last != nil && (cancelDaemon || st.TimedOut() || (last.Status == store.RunCancelled && last.CancelRequested)) {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer ccancel()
		if _, err := m.Turns.Cancel(cctx, in, last.SessionID); err != nil {
			m.Log.Warn("cancel the daemon's run of an ended background run", "run", id, "err", err)
		}
	}
}

// recordRetry is record, retried a few times over a database that fails.
func (m *Manager) recordRetry(ctx context.Context, id string, ev *interndv1.RunEvent, chunks []*cohortv1.ChatCompletionChunk) (*store.Run, error) {
	var err error
	for i := range 4 {
		var r *store.Run
		if r, err = m.record(ctx, id, ev, chunks, nil); err == nil || errors.Is(err, errLost) {
			return r, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(1<<i) * 250 * time.Millisecond):
		}
	}
	return nil, err
}

// heartbeat renews the lease of a run this process records until ctx
// ends; when another took the run, it stops the recording.
func (m *Manager) heartbeat(ctx context.Context, cancel context.CancelFunc, id string) {
	t := time.NewTicker(m.Config.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := m.lease().Extend(m.DB.NewUpdate().Model((*store.Run)(nil)), m.now()).
			Where("id = ?", id).Where("status = ?", store.RunRunning).Exec(ctx)
		if err != nil {
			continue // the database is away; the lease may pass meanwhile
		}
		if n, _ := res.RowsAffected(); n == 0 {
			cancel()
			return
		}
	}
}

// release ends this process's lease on a run now.
func (m *Manager) release(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.lease().Release(m.DB.NewUpdate().Model((*store.Run)(nil))).Where("id = ?", id).Exec(ctx) //nolint:errcheck
}

// end moves a run from status from to a terminal status with an error,
// with its notification; it reports whether it did.
func (m *Manager) end(ctx context.Context, id, from, to string, e *apierr.Error) (bool, error) {
	var r store.Run
	changed := false
	err := m.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		changed = false
		if err := store.ForUpdate(tx.NewSelect().Model(&r).Where("id = ?", id)).Scan(ctx); err != nil {
			return err
		}
		if r.Status != from {
			return nil
		}
		now := m.now()
		r.Status, r.Pending, r.PauseDeadline, r.EndedAt, r.UpdatedAt, r.SegmentOpen = to, "", nil, &now, now, false
		if e != nil {
			r.Error = errorOf(&cohortv1.ChunkError{Code: int32(e.Status), Message: e.Message, Reason: string(e.Reason)})
		}
		if _, err := tx.NewUpdate().Model(&r).WherePK().Exec(ctx); err != nil {
			return err
		}
		changed = true
		return m.notify(ctx, tx, &r, "run."+to)
	})
	if changed && err == nil {
		m.bump(id)
		if m.Notifier != nil {
			m.Notifier.Notify()
		}
		if m.Observer != nil {
			m.Observer.RunEnded(to, r.EndedAt.Sub(r.CreatedAt))
		}
	}
	return changed && err == nil, err
}

// Run takes over the running runs no gateway records (their lease passed:
// a gateway was killed; or was released: a gateway stopped), each on its
// own goroutine; ends paused runs whose question expired; and deletes ended
// runs past the retention, until ctx ends or Close. It looks for runs to
// take over every Config.Scan, so a stopped gateway's runs are recorded
// again within it. What fails is logged and tried again at the next look;
// Run returns nil when ctx ends or at Close (the gateway's loops, ADR 0971).
func (m *Manager) Run(ctx context.Context) error {
	scan := time.NewTicker(m.Config.Scan)
	defer scan.Stop()
	// Wakes at the next paused run's deadline, so that an expired question
	// ends its run then, not at the next look.
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	var lastRetention time.Time
	for {
		m.stayAlive(ctx)
		m.takeOver(ctx)
		// Every look, not only here: a question another replica recorded
		// (perhaps killed since) expires within a look of its deadline.
		m.expirePaused(ctx)
		expiry.Reset(m.nextExpiry(ctx))
		if time.Since(lastRetention) > 10*time.Minute {
			lastRetention = time.Now()
			m.retain(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-m.ctx.Done():
			return nil
		case <-scan.C:
		case <-expiry.C:
		case <-m.paused:
		}
	}
}

// nextExpiry is how long until the earliest paused run's question
// expires (with the grace), at most an hour.
func (m *Manager) nextExpiry(ctx context.Context) time.Duration {
	var next []time.Time
	err := m.DB.NewSelect().Model((*store.Run)(nil)).Column("pause_deadline").Where("status = ?", store.RunPaused).
		Where("pause_deadline IS NOT NULL").OrderExpr("pause_deadline").Limit(1).Scan(ctx, &next)
	if err != nil || len(next) == 0 {
		return time.Hour
	}
	// A little past the deadline: expirePaused wants it strictly passed.
	return min(time.Hour, max(time.Millisecond, next[0].Add(m.Config.PauseGrace+5*time.Millisecond).Sub(m.now())))
}

// takeOver claims the running runs whose lease passed, as many as this
// process may take over at once, each with a conditional update (exactly
// one gateway wins a run), and follows each on its own goroutine.
func (m *Manager) takeOver(ctx context.Context) {
	m.mu.Lock()
	room := m.Config.Takeovers - m.taking
	m.mu.Unlock()
	if room <= 0 {
		return
	}
	now := m.now()
	var free []struct {
		ID    string `bun:"id"`
		Owner string `bun:"lease_owner"`
	}
	err := m.DB.NewSelect().Model((*store.Run)(nil)).Column("id", "lease_owner").Where("status = ?", store.RunRunning).
		Where(store.LeaseFree("", now)).OrderExpr("created_at").Limit(100).Scan(ctx, &free)
	if err != nil {
		return
	}
	lapsed := len(free)
	if notLive, args, ok := store.NotLive(m.DB, `"run".lease_owner`, liveNS); ok {
		// Runs whose recorder died (its liveness lock is free), their
		// lease not passed yet: a killed gateway's runs, taken over now.
		var dead []struct {
			ID    string `bun:"id"`
			Owner string `bun:"lease_owner"`
		}
		err := m.DB.NewSelect().Model((*store.Run)(nil)).Column("id", "lease_owner").Where("status = ?", store.RunRunning).
			Where(store.LeaseHeld("", now)).Where("lease_owner NOT IN (?)", bun.List([]string{"", m.owner})).
			Where(notLive, args...).
			OrderExpr("created_at").Limit(100).Scan(ctx, &dead)
		if err == nil {
			free = append(free, dead...)
		}
	}
	for i, r := range free {
		if room <= 0 || m.ctx.Err() != nil {
			return
		}
		if m.owns(r.ID) {
			continue
		}
		q := m.DB.NewUpdate().Model((*store.Run)(nil)).Set(m.lease().Take(now)).
			Where("id = ?", r.ID).Where("status = ?", store.RunRunning)
		if i < lapsed {
			q = q.Where(store.LeaseFree("", now))
		} else {
			q = q.Where("lease_owner = ?", r.Owner) // still the dead one's
		}
		res, err := q.Exec(ctx)
		if err != nil {
			return
		}
		if n, _ := res.RowsAffected(); n == 1 {
			room--
			m.adopt(r.ID)
		}
	}
}

// adopt records a run whose lease this process has just claimed: from
// now on its lease is renewed (so it cannot pass while the daemon is
// silent), and its daemon's stream is attached to and followed on a
// goroutine of its own, so no run waits for another's daemon.
func (m *Manager) adopt(id string) {
	m.mu.Lock()
	m.taking++
	m.mu.Unlock()
	done := sync.OnceFunc(func() {
		m.mu.Lock()
		m.taking--
		m.mu.Unlock()
	})
	m.Log.Info("took over a background run", "run", id)
	ctx, cancel := context.WithCancel(m.ctx)
	held := m.hold(ctx, cancel, id, func() {
		defer done()
		in, st := m.resume(ctx, id)
		done()
		if st != nil {
			m.followStream(ctx, id, in, st)
		}
	})
	if !held {
		done()
	}
}

// resume attaches to the daemon's run from the event after the last one
// recorded; nil when it cannot (the run failed, or is left for another
// try once its lease passes).
func (m *Manager) resume(ctx context.Context, id string) (*store.Intern, *turn.Stream) {
	var r store.Run
	if err := m.DB.NewSelect().Model(&r).Where("id = ?", id).Scan(ctx); err != nil {
		return nil, nil
	}
	if r.LeaseOwner != m.owner || r.Status != store.RunRunning {
		return nil, nil // taken since, or ended
	}
	fail := func(e *apierr.Error) {
		if _, err := m.end(ctx, id, store.RunRunning, store.RunFailed, e); err != nil {
			m.Log.Error("end a background run that cannot be taken over", "run", id, "err", err)
		}
	}
	if r.SessionID == "" || r.DaemonRunID == "" {
		fail(apierr.New(http.StatusBadGateway, apierr.ReasonStreamSevered, "the gateway stopped before the run started"))
		return nil, nil
	}
	var in store.Intern
	if err := m.DB.NewSelect().Model(&in).Where("id = ?", r.InternID).Scan(ctx); err != nil || in.State == store.InternDeleted {
		fail(apierr.New(http.StatusGone, apierr.ReasonRunEnded, "the intern of the run is gone"))
		return nil, nil
	}
	id0, created := r.CompletionID, r.CompletionCreated
	if !r.SegmentOpen || id0 == "" {
		id0, created = "chatcmpl-"+randomID(18), m.now().Unix()
	}
	// The former recorder may still be attached for a moment (the daemon
	// lets one reader attach): its connection closing, or its next write
	// finding the lease gone, lets go. Tried again meanwhile, the lease
	// held, for up to a lease.
	var st *turn.Stream
	var err error
	for wait, began := 100*time.Millisecond, time.Now(); ; wait = min(2*wait, 2*time.Second) {
		st, err = m.Turns.Reattach(ctx, &in, turn.Resume{SessionID: r.SessionID, DaemonRunID: r.DaemonRunID, From: uint64(r.DaemonSeq) + 1,
			ID: id0, Created: created, RoleSent: r.SegmentOpen, Usage: usageFrom(r.Usage)})
		if err == nil || ctx.Err() != nil {
			break
		}
		e := apierr.From(err)
		if !transient(e) || time.Since(began)+wait > m.Config.Lease {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil // stopping, or another holds the run now
		}
		e := apierr.From(err)
		if transient(e) && m.now().Sub(r.UpdatedAt) < 10*m.Config.Lease {
			return nil, nil // tried again once this lease passes
		}
		fail(e)
		return nil, nil
	}
	m.Log.Debug("attached to a background run's daemon", "run", id, "from_seq", r.DaemonSeq+1)
	return &in, st
}

// transient: a refusal to attach that may pass (another reader still
// attached, the daemon away a moment).
func transient(e *apierr.Error) bool {
	return (e.Status == http.StatusConflict && e.Reason == apierr.ReasonAttachmentFailed) || e.Reason == apierr.ReasonInternUnreachable || e.Reason == apierr.ReasonInternNotReady
}

func (m *Manager) expirePaused(ctx context.Context) {
	var ids []string
	err := m.DB.NewSelect().Model((*store.Run)(nil)).Column("id").Where("status = ?", store.RunPaused).
		Where("pause_deadline < ?", m.now().Add(-m.Config.PauseGrace)).Limit(100).Scan(ctx, &ids)
	if err != nil {
		return
	}
	for _, id := range ids {
		m.end(ctx, id, store.RunPaused, store.RunCancelled, apierr.New(http.StatusGone, apierr.ReasonRunEnded, "the interaction deadline passed; the run was cancelled")) //nolint:errcheck
	}
}

// retain deletes the runs that ended before the retention period, with
// their chunks.
func (m *Manager) retain(ctx context.Context) {
	cutoff := m.now().Add(-m.Config.Retention)
	old := m.DB.NewSelect().Model((*store.Run)(nil)).Column("id").Where("ended_at < ?", cutoff)
	if _, err := m.DB.NewDelete().Model((*store.RunEvent)(nil)).Where("run_id IN (?)", old).Exec(ctx); err != nil {
		m.Log.Warn("delete old background run events", "err", err)
		return
	}
	if _, err := m.DB.NewDelete().Model((*store.Run)(nil)).Where("ended_at < ?", cutoff).Exec(ctx); err != nil {
		m.Log.Warn("delete old background runs", "err", err)
	}
}
