// Package runs is background turns (docs/background.md): a chat request
// with "background": true starts its run detached on the intern's daemon
// and returns at once; a gateway process records the run's chunks in the
// database as the stream would have sent them, with a sequence number,
// and its status (running, paused, completed, failed, cancelled). Readers
// stream the chunks back from any sequence number on any replica. The
// gateway that records a run holds a lease on it: when that gateway goes
// away, another (or the same, restarted) takes the run over and attaches
// to the daemon from the last recorded event.
package runs

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/turn"
)

// RunNotifier is told of a run's status changes (internal/webhooks). It is
// called inside the database transaction that records the change, with
// eventType "run.paused", "run.completed", "run.failed" or
// "run.cancelled" and run the run object exactly as GET run returns it
// (a paused run's pending_interaction included). An error rolls the
// change back; the recorder retries it. Notify follows the commit of a
// transaction that called RunChanged (a worker may pick the change up now).
// Observer counts what the runs of this replica do: a run started, a run
// ended (with its status and its whole time), chunks stored and chunks
// dropped past the event bytes cap.
type Observer interface {
	RunStarted()
	RunEnded(status string, took time.Duration)
	RunEvents(stored, dropped int)
}

type RunNotifier interface {
	RunChanged(ctx context.Context, db bun.IDB, workspaceID, eventType string, run json.RawMessage) error
	Notify()
}

// Defaults of Config (ADR 0033).
const (
	DefaultMaxRunning    = 16
	DefaultMaxEventBytes = 8 << 20
	DefaultRetention     = 7 * 24 * time.Hour
	DefaultLease         = 30 * time.Second
	DefaultPoll          = 250 * time.Millisecond
	DefaultScan          = 500 * time.Millisecond
	DefaultTakeovers     = 32
)

// Config are the settings of background runs; zero values take the
// defaults.
type Config struct {
	// MaxRunning caps the running background runs of one workspace.
	MaxRunning int
	// MaxEventBytes caps the stored chunks of one run (their JSON):
	// past it only the chunks that end a response are kept.
	MaxEventBytes int64
	// Retention is how long an ended run and its chunks are kept.
	Retention time.Duration
	// Lease is how long a gateway's claim to record a run lasts without
	// being renewed: the longest a run goes unrecorded after its gateway
	// was killed.
	Lease time.Duration
	// Poll is how often a reader on a replica that does not record the
	// run looks for new chunks.
	Poll time.Duration
	// PauseGrace is how long after its question's deadline a paused run
	// is ended here (the daemon cancels it at the deadline); 0 ends it at
	// the deadline.
	PauseGrace time.Duration
	// Keepalive is the silence after which an event stream (both doors)
	// sends a keepalive, so that idle proxies keep a paused run's stream
	// open; sse.DefaultKeepalive (the spec's 30 s) when 0.
	Keepalive time.Duration
	// Scan is how often Run looks for running runs no gateway holds (a
	// lease released by a gateway that stopped, or passed): a stopped
	// gateway's runs are taken over within it (ADR 0921).
	Scan time.Duration
	// Takeovers bounds the runs this process is taking over at once
	// (claimed, not yet attached to their daemon); each is followed on
	// its own, so none waits for another's daemon.
	Takeovers int
}

func (c *Config) defaults() {
	if c.MaxRunning <= 0 {
		c.MaxRunning = DefaultMaxRunning
	}
	if c.MaxEventBytes <= 0 {
		c.MaxEventBytes = DefaultMaxEventBytes
	}
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	if c.Poll <= 0 {
		c.Poll = DefaultPoll
	}
	if c.Keepalive <= 0 {
		c.Keepalive = sse.DefaultKeepalive
	}
	if c.Scan <= 0 {
		c.Scan = DefaultScan
	}
	if c.Takeovers <= 0 {
		c.Takeovers = DefaultTakeovers
	}
}

// Manager runs background turns. Start it (Run) once per process.
type Manager struct {
	DB *bun.DB
	// Turns opens the runs' turns on the daemons, as it does the chat
	// doors' (ADR 0971).
	Turns   *turn.Service
	Interns *interns.Service
	Log     *slog.Logger
	// Notifier, when set, is told of every status change.
	Notifier RunNotifier
	// Observer, when set, counts runs and their events (the metrics).
	Observer Observer
	Config   Config

	owner string // this process's lease name

	ctx    context.Context // the recorders'; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	stopping  chan struct{} // closed by Close: readers here end, to resume elsewhere

	alive *store.LiveLock // this process's liveness lock (liveNS, owner)

	paused chan struct{} // a run paused here: Run looks at its deadline

	mu      sync.Mutex
	waiters map[string]chan struct{} // run id → closed when it has news
	owned   map[string]bool          // runs this process records
	taking  int                      // runs claimed and not yet attached (≤ Config.Takeovers)
}

// New returns a Manager; nothing runs until Run.
func New(db *bun.DB, turns *turn.Service, ins *interns.Service, log *slog.Logger, cfg Config) *Manager {
	cfg.defaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	owner := "gw_" + randomID(9)
	return &Manager{DB: db, Turns: turns, Interns: ins, Log: log, Config: cfg, owner: owner, alive: store.NewLiveLock(db, liveNS, owner),
		ctx: ctx, cancel: cancel, stopping: make(chan struct{}), paused: make(chan struct{}, 1),
		waiters: map[string]chan struct{}{}, owned: map[string]bool{}}
}

func randomID(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (m *Manager) now() time.Time { return time.Now().UTC() }

// lease is this process's lease on the runs it records (ADR 0952).
func (m *Manager) lease() store.Lease { return store.Lease{Owner: m.owner, Term: m.Config.Lease} }

// Close stops recording: the event streams read here end (their readers
// resume on another replica from their last event id), the recorders stop
// and the runs this process recorded are released (their lease ends now),
// so another gateway takes them over within Config.Scan; their daemon runs
// go on. A gateway calls it as its graceful stop begins (ADR 0921); it may
// be called more than once, and later calls wait for the first.
func (m *Manager) Close() {
	m.closeOnce.Do(func() {
		close(m.stopping)
		m.mu.Lock()
		m.cancel()
		m.mu.Unlock()
		m.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := m.lease().Release(m.DB.NewUpdate().Model((*store.Run)(nil))).
			Where("status = ?", store.RunRunning).Exec(ctx); err != nil {
			m.Log.Warn("release background runs", "err", err)
		}
		m.alive.Release()
	})
}

// liveNS is the namespace of the liveness lock a gateway holds for as
// long as it lives (named by its lease owner): other gateways see a killed
// recorder at once (ADR 0923; store.LiveLock).
const liveNS = 0x636f6872

// stayAlive takes, or checks every few seconds, this process's liveness
// lock. Errors are left to the next call: meanwhile the leases still hold.
func (m *Manager) stayAlive(ctx context.Context) {
	if m.ctx.Err() != nil {
		return
	}
	m.alive.Hold(ctx)
}

// errStopping ends a reader's event stream on a gateway that stops: it
// resumes on another replica (Last-Event-ID, or after=) with no gap.
var errStopping = apierr.New(http.StatusServiceUnavailable, "temporarily_unavailable",
	"this gateway is stopping; resume the run's events from the last event id through another")

// owns says whether this process records run id.
func (m *Manager) owns(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.owned[id]
}

// waiter is closed when run id has news (a chunk, a status).
func (m *Manager) waiter(id string) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := m.waiters[id]
	if ch == nil {
		ch = make(chan struct{})
		m.waiters[id] = ch
	}
	return ch
}

func (m *Manager) bump(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch := m.waiters[id]; ch != nil {
		close(ch)
		delete(m.waiters, id)
	}
}

// errCap is the 429 of a workspace at its cap of running background runs.
func errCap(n int) *apierr.Error {
	return apierr.New(http.StatusTooManyRequests, apierr.ReasonRateLimited,
		"this workspace has %d background runs running, as many as it may; wait for one to end or cancel one", n).Retry(5)
}

// Paused reports whether a background run of the intern's session is
// paused: a tool message to that session continues it in the
// background, whatever its background flag says (the chat doors ask).
func (m *Manager) Paused(ctx context.Context, internID, sessionID string) bool {
	n, err := m.DB.NewSelect().Model((*store.Run)(nil)).Where("intern_id = ?", internID).Where("session_id = ?", sessionID).
		Where("status = ?", store.RunPaused).Count(ctx)
	return err == nil && n > 0
}

// Started is a started background run.
type Started struct {
	Run *cohortv1.BackgroundRun
	// JSON is the run object as the REST door's GET run returns it: the
	// REST door's 202 body.
	JSON []byte
}

// Start starts the run of a chat request with "background": true (or,
// for a tool message, continues the paused one) with no caller attached
// and returns it once it is under way; both chat doors hand such a
// request here. load reads the intern's row (the REST door's was read
// with the key). A refusal is an *apierr.Error, as for a streamed
// request.
func (m *Manager) Start(ctx context.Context, p *auth.Principal, req *cohortv1.StreamChatCompletionRequest, load func() (*store.Intern, error)) (*Started, error) {
	if m.ctx.Err() != nil {
		return nil, errStopping // another replica starts it
	}
	in, err := load()
	if err != nil {
		return nil, err
	}
	msgs := req.GetMessages()
	var cont *store.Run
	if n := len(msgs); n > 0 && msgs[n-1].GetRole() == "tool" && req.SessionId != nil {
		// An answer to a background run's pause continues that run.
		var r store.Run
		err := m.DB.NewSelect().Model(&r).Where("intern_id = ?", in.ID).Where("session_id = ?", req.GetSessionId()).
			Where("status = ?", store.RunPaused).OrderExpr("created_at DESC").Limit(1).Scan(ctx)
		switch {
		case err == nil:
			cont = &r
		case !errors.Is(err, sql.ErrNoRows):
			return nil, apierr.Internal(err)
		}
	}
	var run *store.Run
	if cont != nil {
		n, err := m.DB.NewSelect().Model((*store.Run)(nil)).Where("workspace_id = ?", in.WorkspaceID).Where("status = ?", store.RunRunning).Count(ctx)
		if err != nil {
			return nil, apierr.Internal(err)
		}
		if int(n) >= m.Config.MaxRunning {
			return nil, errCap(m.Config.MaxRunning)
		}
		run = cont
	} else {
		if run, err = m.insert(ctx, in, turn.Caller(p)); err != nil {
			return nil, err
		}
	}
	rctx, cancel := context.WithCancel(m.ctx)
	st, err := m.Turns.Open(rctx, p, req, func() (*store.Intern, error) { return in, nil }, turn.Options{Detached: true})
	if err != nil {
		cancel()
		if cont == nil {
			m.remove(run.ID)
		}
		return nil, err
	}
	// The first chunk (the role chunk of the daemon's Started) is recorded
	// before the caller hears of the run: the run then has its session,
	// and a gateway that takes it over knows where to attach.
	ev, chunks, err := st.NextEvent()
	if err == nil {
		run, err = m.record(context.WithoutCancel(ctx), run.ID, ev, chunks, &segment{id: st.ID(), created: chunks[0].GetCreated(), resume: cont != nil})
	}
	if err != nil {
		st.Close()
		cancel()
		if cont == nil {
			m.remove(run.ID)
		}
		if errors.Is(err, errLost) {
			// Cancelled (or expired) while the answer was on its way:
			// the daemon's detached run must not go on unrecorded.
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer ccancel()
			m.Turns.Cancel(cctx, in, run.SessionID) //nolint:errcheck
			return nil, apierr.Conflict(apierr.ReasonRunEnded, "the run was cancelled while the answer was on its way")
		}
		return nil, apierr.From(err)
	}
	if cont == nil && m.Observer != nil {
		m.Observer.RunStarted()
	}
	m.follow(rctx, cancel, run.ID, in, st)
	b, err := runJSON(run)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return &Started{JSON: b, Run: &cohortv1.BackgroundRun{Id: run.ID, InternId: run.InternID, SessionId: run.SessionID, Status: run.Status}}, nil
}

// insert records a new running run of in's workspace, refused past the
// workspace's cap. The count and the insert are one transaction, under a
// lock per workspace (store.XactLock), so replicas
// starting runs at once never pass the cap together.
func (m *Manager) insert(ctx context.Context, in *store.Intern, caller string) (*store.Run, error) {
	now := m.now()
	lease := m.lease().Until(now)
	r := &store.Run{ID: "run_" + randomID(18), OrganizationID: in.OrganizationID, WorkspaceID: in.WorkspaceID, InternID: in.ID,
		Caller: caller, Status: store.RunRunning, LeaseOwner: m.owner, LeaseUntil: &lease, CreatedAt: now, UpdatedAt: now}
	m.stayAlive(ctx) // before the run is ours: others see this process live
	err := m.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if err := store.XactLock(ctx, tx, "cohort.runs:"+in.WorkspaceID); err != nil {
			return err
		}
		n, err := tx.NewSelect().Model((*store.Run)(nil)).Where("workspace_id = ?", in.WorkspaceID).Where("status = ?", store.RunRunning).Count(ctx)
		if err != nil {
			return err
		}
		if int(n) >= m.Config.MaxRunning {
			return errCap(m.Config.MaxRunning)
		}
		_, err = tx.NewInsert().Model(r).Exec(ctx)
		return err
	})
	if err != nil {
		var ae *apierr.Error
		if errors.As(err, &ae) {
			return nil, ae
		}
		return nil, apierr.Internal(err)
	}
	m.mu.Lock()
	m.owned[r.ID] = true
	m.mu.Unlock()
	return r, nil
}

// remove deletes a run the daemon refused to start: it never existed.
func (m *Manager) remove(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := m.DB.NewDelete().Model((*store.Run)(nil)).Where("id = ?", id).Exec(ctx); err != nil {
		m.Log.Error("remove a refused background run", "run", id, "err", err)
	}
	m.mu.Lock()
	delete(m.owned, id)
	m.mu.Unlock()
}
