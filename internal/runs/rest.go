package runs

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/rest"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/store"
)

// object is a run as the API shows it (docs/background.md).
type object struct {
	ID        string  `json:"id"`
	Object    string  `json:"object"`
	InternID  string  `json:"intern_id"`
	SessionID *string `json:"session_id"`
	Status    string  `json:"status"`
	// PendingInteraction is the tool call a paused run waits on, as the
	// stream showed it: answer it with a tool message whose tool_call_id
	// is its id.
	PendingInteraction json.RawMessage `json:"pending_interaction"`
	PauseDeadline      *string         `json:"pause_deadline"`
	Error              json.RawMessage `json:"error"`
	Usage              json.RawMessage `json:"usage"`
	CancelRequested    bool            `json:"cancel_requested"`
	// LastEventID is the sequence number of the last stored chunk.
	LastEventID     int64   `json:"last_event_id"`
	EventsTruncated bool    `json:"events_truncated"`
	CreatedAt       string  `json:"created_at"`
	UpdatedAt       string  `json:"updated_at"`
	EndedAt         *string `json:"ended_at"`
}

const timeFormat = "2006-01-02T15:04:05.000Z07:00"

func stamp(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := t.UTC().Format(timeFormat)
	return &s
}

func raw(s string) json.RawMessage {
	if s == "" {
		return json.RawMessage("null")
	}
	return json.RawMessage(s)
}

func toObject(r *store.Run) object {
	// What is no longer true is not shown: the question and its deadline
	// belong to a paused run only (the row keeps them from the event that
	// asked, a moment before the status says so), a cancel is requested
	// only of a run that has not ended.
	pending, deadline := "", (*time.Time)(nil)
	if r.Status == store.RunPaused {
		pending, deadline = r.Pending, r.PauseDeadline
	}
	o := object{ID: r.ID, Object: "intern.run", InternID: r.InternID, Status: r.Status,
		PendingInteraction: raw(pending), PauseDeadline: stamp(deadline), Error: raw(r.Error), Usage: raw(r.Usage),
		CancelRequested: r.CancelRequested && !terminal(r.Status), LastEventID: r.LastSeq, EventsTruncated: r.EventsTruncated,
		CreatedAt: *stamp(&r.CreatedAt), UpdatedAt: *stamp(&r.UpdatedAt), EndedAt: stamp(r.EndedAt)}
	if r.SessionID != "" {
		o.SessionID = &r.SessionID
	}
	if r.Status != store.RunPaused {
		o.PendingInteraction = json.RawMessage("null")
	}
	return o
}

// runJSON is the run object, as GET run returns it.
func runJSON(r *store.Run) ([]byte, error) { return json.Marshal(toObject(r)) }

// load reads a run of an intern the caller may use (the chat's rule: the
// same 404 for an intern of another workspace as for none).
func (m *Manager) load(ctx context.Context, p *auth.Principal, internID, runID string) (*store.Intern, *store.Run, error) {
	in, err := m.Interns.Load(ctx, p, internID)
	if err != nil {
		return nil, nil, err
	}
	var r store.Run
	err = m.DB.NewSelect().Model(&r).Where("id = ?", runID).Where("intern_id = ?", in.ID).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, apierr.NotFound("run %q not found", runID)
	}
	if err != nil {
		return nil, nil, apierr.Internal(err)
	}
	return in, &r, nil
}

// GetRun is the run runID of intern internID, for both doors.
func (m *Manager) GetRun(ctx context.Context, p *auth.Principal, internID, runID string) (*store.Run, error) {
	_, run, err := m.load(ctx, p, internID, runID)
	return run, err
}

// ListSessionRuns is the session's background runs, oldest first, for
// both doors.
func (m *Manager) ListSessionRuns(ctx context.Context, p *auth.Principal, internID, sessionID string) ([]store.Run, error) {
	in, err := m.Interns.Load(ctx, p, internID)
	if err != nil {
		return nil, err
	}
	var runs []store.Run
	if err := m.DB.NewSelect().Model(&runs).Where("intern_id = ?", in.ID).Where("session_id = ?", sessionID).
		OrderExpr("created_at, id").Limit(1000).Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return runs, nil
}

// CancelRun cancels a run, for both doors. A paused run is cancelled at
// once; a running one is asked to stop (its cancel_requested is true) and
// becomes cancelled when the daemon has stopped it. A run that has ended
// is 409 run_ended. It returns the run after the change.
func (m *Manager) CancelRun(ctx context.Context, p *auth.Principal, internID, runID string) (*store.Run, error) {
	in, run, err := m.load(ctx, p, internID, runID)
	if err != nil {
		return nil, err
	}
	switch run.Status {
	case store.RunPaused:
		ok, err := m.end(ctx, run.ID, store.RunPaused, store.RunCancelled, apierr.New(http.StatusGone, apierr.ReasonRunEnded, "the caller cancelled the run"))
		if err != nil {
			return nil, apierr.Internal(err)
		}
		if ok {
			// The daemon holds the run open across its question: end it.
			if _, err := m.Turns.Cancel(ctx, in, run.SessionID); err != nil {
				m.Log.Warn("cancel a paused background run on its daemon", "run", run.ID, "err", err)
			}
		}
	case store.RunRunning:
		if _, err := m.DB.NewUpdate().Model((*store.Run)(nil)).Set("cancel_requested = ?", true).Set("updated_at = ?", m.now()).
			Where("id = ?", run.ID).Where("status = ?", store.RunRunning).Exec(ctx); err != nil {
			return nil, apierr.Internal(err)
		}
		if run.SessionID != "" {
			if _, err := m.Turns.Cancel(ctx, in, run.SessionID); err != nil {
				return nil, err
			}
			m.recordHere(ctx, run.ID)
		}
	default:
		return nil, apierr.Conflict(apierr.ReasonRunEnded, "the run has already ended: it is %s", run.Status)
	}
	_, run, err = m.load(ctx, p, in.ID, run.ID)
	return run, err
}

// recordHere makes this process the recorder of a running run it does not
// record: its gateway may have been killed, its lease not passed yet, and
// the daemon's end of the run would then wait for the lease to show. The
// lease moves here at once (a live recorder's next write finds it gone and
// stops; nothing is recorded twice) and the rest is attached to from the
// last recorded event (ADR 0922).
func (m *Manager) recordHere(ctx context.Context, id string) {
	if m.owns(id) || m.ctx.Err() != nil {
		return
	}
	res, err := m.DB.NewUpdate().Model((*store.Run)(nil)).Set(m.lease().Take(m.now())).
		Where("id = ?", id).Where("status = ?", store.RunRunning).Where("lease_owner <> ?", m.owner).Exec(ctx)
	if err != nil {
		m.Log.Warn("record a cancelled background run here", "run", id, "err", err)
		return
	}
	if n, _ := res.RowsAffected(); n == 1 {
		m.adopt(id)
	}
}

// eventsBatch bounds the chunks read per query.
const eventsBatch = 256

// Tail sends run's chunks after sequence number after, in order, batch by
// batch, live until the run has ended (then it returns nil); a paused
// run's tail waits until the run goes on or ends. keepalive, when not
// nil, is called after Config.Keepalive of silence. It returns send's or
// keepalive's error, or the context's; a 503 temporarily_unavailable once
// this gateway stops (Close), whose readers resume elsewhere from their
// last event. Both doors' event streams are this
// loop; the caller loads the run first (GetRun), so that a refusal comes
// before its stream opens.
func (m *Manager) Tail(ctx context.Context, run *store.Run, after int64, send func([]store.RunEvent) error, keepalive func() error) error {
	poll := time.NewTicker(m.Config.Poll)
	defer poll.Stop()
	keep := time.NewTimer(m.Config.Keepalive)
	defer keep.Stop()
	for {
		// The status first: a run's last chunks commit with its ending,
		// so after an ended status every chunk is there to read.
		var status string
		if err := m.DB.NewSelect().Model((*store.Run)(nil)).Column("status").Where("id = ?", run.ID).Scan(ctx, &status); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, sql.ErrNoRows) {
				return apierr.NotFound("run %q not found", run.ID)
			}
			return apierr.Internal(err)
		}
		var evs []store.RunEvent
		if err := m.DB.NewSelect().Model(&evs).Where("run_id = ?", run.ID).Where("seq > ?", after).
			OrderExpr("seq").Limit(eventsBatch).Scan(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return apierr.Internal(err)
		}
		if len(evs) > 0 {
			if err := send(evs); err != nil {
				return err
			}
			after = evs[len(evs)-1].Seq
			keep.Reset(m.Config.Keepalive)
			if len(evs) == eventsBatch {
				continue
			}
		}
		if terminal(status) {
			return nil
		}
		// A chunk recorded between the reads above and this is found by
		// the poll on the next tick.
		wake := m.waiter(run.ID)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.stopping:
			return errStopping
		case <-wake:
		case <-poll.C:
		case <-keep.C:
			if keepalive != nil {
				if err := keepalive(); err != nil {
					return err
				}
			}
			keep.Reset(m.Config.Keepalive)
		}
	}
}

// Get is GET /api/v1/interns/{internId}/runs/{runId}.
func (m *Manager) Get(w http.ResponseWriter, r *http.Request) {
	run, err := m.GetRun(r.Context(), auth.From(r.Context()), r.PathValue("internId"), r.PathValue("runId"))
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	rest.WriteJSON(w, http.StatusOK, toObject(run))
}

// List is GET /api/v1/interns/{internId}/sessions/{sessionId}/runs.
func (m *Manager) List(w http.ResponseWriter, r *http.Request) {
	runs, err := m.ListSessionRuns(r.Context(), auth.From(r.Context()), r.PathValue("internId"), r.PathValue("sessionId"))
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	out := struct {
		Object string   `json:"object"`
		Data   []object `json:"data"`
	}{Object: "list", Data: []object{}}
	for i := range runs {
		out.Data = append(out.Data, toObject(&runs[i]))
	}
	rest.WriteJSON(w, http.StatusOK, out)
}

// Cancel is POST /api/v1/interns/{internId}/runs/{runId}/cancel.
func (m *Manager) Cancel(w http.ResponseWriter, r *http.Request) {
	run, err := m.CancelRun(r.Context(), auth.From(r.Context()), r.PathValue("internId"), r.PathValue("runId"))
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	rest.WriteJSON(w, http.StatusOK, toObject(run))
}

// Events is GET /api/v1/interns/{internId}/runs/{runId}/events: the run's
// chunks (Tail) as the chat stream's server-sent events, each with its
// sequence number as `id:`, from after Last-Event-ID (or ?after=, else from
// the start), then `data: [DONE]` once the run has ended; keepalives while
// nothing comes. A reconnect (Last-Event-ID) to an ended run with nothing
// after it is 204 No Content.
func (m *Manager) Events(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	run, err := m.GetRun(ctx, auth.From(ctx), r.PathValue("internId"), r.PathValue("runId"))
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	after := int64(0)
	from := r.Header.Get("Last-Event-ID")
	reconnect := from != ""
	if from == "" {
		from = r.URL.Query().Get("after")
	}
	if from != "" {
		if after, err = strconv.ParseInt(from, 10, 64); err != nil || after < 0 {
			rest.WriteError(w, r, errAfter(from), true)
			return
		}
	}
	// An EventSource reconnects after every end of stream; 204 is the
	// HTML standard's word to stop. Only for Last-Event-ID: a reader that
	// asks ?after= itself still gets the stream's end.
	if reconnect && terminal(run.Status) && after >= run.LastSeq {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(b []byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(sse.DefaultWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	var buf []byte
	err = m.Tail(ctx, run, after, func(evs []store.RunEvent) error {
		buf = buf[:0]
		for _, ev := range evs {
			buf = append(buf, "id: "...)
			buf = strconv.AppendInt(buf, ev.Seq, 10)
			buf = append(buf, "\ndata: "...)
			buf = append(buf, ev.Data...)
			buf = append(buf, '\n', '\n')
		}
		return write(buf)
	}, func() error { return write([]byte(": keepalive\n\n")) })
	if err == nil {
		write([]byte("data: [DONE]\n\n")) //nolint:errcheck
	}
	// Otherwise the run was deleted, the caller left, or this gateway
	// stops (errStopping): the stream just ends, without [DONE], and an
	// EventSource reconnects with Last-Event-ID (another replica).
}

// errAfter refuses a resume point that is not a sequence number.
func errAfter(from string) error {
	return apierr.BadRequest("Last-Event-ID or after must be a sequence number (0 or more), not %q", from)
}
