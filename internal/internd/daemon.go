// Package internd is one intern's daemon (`cohort intern`). It owns the
// intern's sessions (persisted in its data directory), its runs (in memory,
// each with a numbered event log kept up to a retention bound), the pending
// interactions and their deadlines. Toward the gateway it serves
// cohort.internd.v1.InternDaemonService (Connect, h2c), authenticated by the
// intern's secret; toward the agent it is the Agent Client Protocol client
// of a subprocess speaking ACP over stdio.
package internd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/httptool"
	"github.com/cohort-dev/cohort/internal/idle"
	"github.com/cohort-dev/cohort/internal/internd/launch"
)

// Limits of the daemon protocol (the spec's Limits table).
const (
	MaxSessionID     = 256
	MaxPrompt        = 32000
	MaxInteractionID = 128
	// runsPerSession is how many finished runs a session keeps for Attach
	// and for telling a late answer "not pending" from "unknown".
	runsPerSession = 16
)

// Config configures a daemon. Zero values take the documented defaults.
type Config struct {
	// InternID names the intern in Status and logs.
	InternID string
	// Secret is the bearer token every call must carry.
	Secret string
	// DataDir holds the sessions and the agent's working directory.
	DataDir string
	// AgentCommand is the agent's argv (ACP over stdio).
	AgentCommand []string
	// AgentEnv is added to the agent's environment.
	AgentEnv []string
	// AgentKeys are model keys the agent holds outside its environment
	// (a config file): redacted, with the daemon's other secrets, from
	// the agent's error messages before they reach a caller.
	AgentKeys []string
	// AgentAuthMethod is the ACP authentication method the operator chose
	// for this agent; the daemon calls authenticate with it before any
	// session when the agent advertises it. "" sends no authenticate.
	AgentAuthMethod string
	// AgentNests marks the built-in agent, which makes jails of its own
	// for manual-mode commands: it keeps the daemon's syscall filter and
	// puts the strict one on every command it runs. Any other agent starts
	// under the strict filter (jail.SeccompStrict).
	AgentNests bool
	// Model is the model configured on the intern, passed to the agent.
	Model string
	// InteractionDeadline is how long a question waits (default 5 minutes).
	InteractionDeadline time.Duration
	// RetainEvents and RetainBytes bound each run's event log
	// (defaults 10,000 events and 4 MiB).
	RetainEvents int
	RetainBytes  int
	// MaxPausedRuns bounds the runs held open across a question (default 256).
	MaxPausedRuns int
	// MaxPausedPerCaller bounds those of one caller (default 32), so one
	// caller cannot fill the intern's share for everyone.
	MaxPausedPerCaller int
	// FinishedRunTTL is how long an ended run's events stay for Attach
	// (default 10 minutes); then only its outcome is remembered.
	FinishedRunTTL time.Duration
	// SessionIdleTTL is how long a session no run uses stays in memory
	// (default FinishedRunTTL + 1 minute); then only its file remains and
	// the next turn reads it again. Keep it below the agent's own bound
	// (cohort agent: 30 minutes), so the agent never forgets a session the
	// daemon still holds.
	SessionIdleTTL time.Duration
	// MaxIdleSessions bounds the sessions kept in memory (default 256):
	// past a quarter more, the least recently used that no run uses leave
	// memory at once, as after SessionIdleTTL, so that memory follows the
	// live sessions, not how many there were in the last minutes.
	MaxIdleSessions int
	// InitTimeout bounds the agent's answer to initialize (default 30 s).
	InitTimeout time.Duration
	// CancelGrace is how long a cancelled turn waits for the agent to
	// confirm before the daemon abandons the agent's prompt (default 5 s).
	CancelGrace time.Duration
	// GatewayURL is the gateway's API base (…/api/v1): the http_request
	// tool asks its InternGatewayService for secrets, presenting Secret.
	GatewayURL string
	// HTTPTool configures the http_request tool (zero: production).
	HTTPTool httptool.Options
	// Log receives the daemon's logs; nil discards them.
	Log *slog.Logger
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
}

// DefaultInteractionDeadline is how long a question waits for its answer
// when the daemon is given no deadline (serve's --interaction-deadline
// shows it); launch owns it, as the daemon's flag default.
const DefaultInteractionDeadline = launch.DefaultInteractionDeadline

func (c *Config) defaults() {
	if c.InteractionDeadline <= 0 {
		c.InteractionDeadline = DefaultInteractionDeadline
	}
	if c.RetainEvents <= 0 {
		c.RetainEvents = 10000
	}
	if c.RetainBytes <= 0 {
		c.RetainBytes = 4 << 20
	}
	if c.MaxPausedRuns <= 0 {
		c.MaxPausedRuns = 256
	}
	if c.MaxPausedPerCaller <= 0 {
		c.MaxPausedPerCaller = 32
	}
	if c.FinishedRunTTL <= 0 {
		c.FinishedRunTTL = 10 * time.Minute
	}
	if c.SessionIdleTTL <= 0 {
		c.SessionIdleTTL = c.FinishedRunTTL + time.Minute
	}
	if c.InitTimeout <= 0 {
		c.InitTimeout = 30 * time.Second
	}
	if c.MaxIdleSessions <= 0 {
		c.MaxIdleSessions = 256
	}
	if c.CancelGrace <= 0 {
		c.CancelGrace = 5 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Daemon is one intern's daemon.
type Daemon struct {
	cfg   Config
	log   *slog.Logger
	store *fileStore
	work  string
	tools *tools // the MCP server offering http_request to the agent
	// redact hides the daemon's secrets in agent messages sent to callers.
	redact *httptool.Redactor

	// agentMu serializes starting the agent.
	agentMu sync.Mutex

	mu       sync.Mutex
	agent    *agentProc // nil while no agent is up
	agentErr string
	agentID  string // name and version the agent reported
	sessions map[string]*session
	idle     *idle.Bound // forgets sessions idle past SessionIdleTTL, or past MaxIdleSessions
	byACP    map[string]*session
	closed   bool

	// turns counts runTurn goroutines, so Close returns only when every
	// turn has recorded its end.
	turns sync.WaitGroup

	live   atomic.Int32 // runs streaming
	paused atomic.Int32 // runs held open across a question
	// lastCall is when a call other than Status last started or ended
	// (unix nanoseconds): Status reports the idle time from it, so a
	// fleet of gateway replicas can agree on who is idle.
	lastCall atomic.Int64
	// pausedBy counts them per caller (guarded by pmu, which also orders
	// reservations against the total).
	pmu      sync.Mutex
	pausedBy map[string]int
}

// session is one conversation, scoped to the intern. Guarded by Daemon.mu.
type session struct {
	rec     *sessionRecord
	acpGen  uint64 // agent generation rec.ACPSessionID belongs to; 0 = none yet
	model   string // the agent's current model id for the session, if it reported one
	busy    bool   // a turn is in flight (streaming or paused)
	current *run
	runs    []*run          // recent runs, oldest first
	byIA    map[string]*run // interaction id → run that asked
	used    time.Time       // the last turn, answer or attach
	// unsaved: the daemon named the session and nothing is stored yet, so
	// its first save need not look for a file (fileStore.create).
	unsaved bool
}

// New opens the daemon's data directory and loads its sessions. It does not
// start the agent: that happens on Start (or on the first turn), so a broken
// agent never keeps the daemon from serving Status.
func New(cfg Config) (*Daemon, error) {
	cfg.defaults()
	if cfg.Secret == "" {
		return nil, errors.New("internd: a secret is required")
	}
	if len(cfg.AgentCommand) == 0 {
		return nil, errors.New("internd: an agent command is required")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("internd: a data directory is required")
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	cfg.DataDir = dir
	fs, err := newFileStore(dir)
	if err != nil {
		return nil, err
	}
	work := filepath.Join(dir, "work")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: cfg.Log, store: fs, work: work, redact: agentRedactor(cfg),
		sessions: map[string]*session{}, byACP: map[string]*session{}}
	d.touch()
	if err := d.startTools(); err != nil {
		return nil, err
	}
	// Sessions are read from disk when a turn needs them, and leave memory
	// when idle (forget): memory follows the live sessions, not all of
	// them.
	// What they held goes back to the kernel after a sweep that forgot
	// some (at most once a sweep): the Go runtime would keep it for minutes.
	d.idle = &idle.Bound{TTL: cfg.SessionIdleTTL, Max: cfg.MaxIdleSessions, Now: d.now, Forget: d.forget, Swept: debug.FreeOSMemory}
	d.idle.Sweep()
	return d, nil
}

// Start starts the agent and reports whether it came up. A failure is not
// fatal: the daemon keeps serving, Status reports it, and the next turn
// tries again.
func (d *Daemon) Start(ctx context.Context) error {
	_, err := d.ensureAgent(ctx)
	return err
}

// Close cancels every run and stops the agent.
func (d *Daemon) Close() error {
	d.mu.Lock()
	d.closed = true
	if d.idle != nil {
		d.idle.Stop()
	}
	var runs []*run
	for _, s := range d.sessions {
		if s.current != nil {
			runs = append(runs, s.current)
		}
	}
	a := d.agent
	d.mu.Unlock()
	for _, r := range runs {
		d.cancelRun(r, errRunEnded("the intern daemon is shutting down"))
	}
	if a != nil {
		// Killing the agent ends every prompt still waiting on it.
		a.stop()
	}
	d.turns.Wait()
	d.tools.close()
	return nil
}

func (d *Daemon) now() time.Time { return d.cfg.Now() }

func newInteractionID() string {
	var b [12]byte
	rand.Read(b[:])
	return "call_" + hex.EncodeToString(b[:])
}

// touch records a call other than Status (its start or its end).
func (d *Daemon) touch() { d.lastCall.Store(d.now().UnixNano()) }

// Status reports health, agent and counts.
func (d *Daemon) Status() *pb.StatusResponse {
	idle := max(d.now().Sub(time.Unix(0, d.lastCall.Load())), 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	return &pb.StatusResponse{InternId: d.cfg.InternID, Agent: d.agentID, Model: d.cfg.Model,
		Sessions: int32(d.store.count()), LiveSessions: int32(len(d.sessions)), LiveRuns: d.live.Load(), PausedRuns: d.paused.Load(), AgentError: d.agentErr,
		IdleMs: idle.Milliseconds()}
}

// checkSessionID applies the 1 to 256 character bound (empty allowed where
// a fresh id is chosen).
func checkSessionID(id string, emptyOK bool) error {
	n := utf8.RuneCountInString(id)
	if (n == 0 && !emptyOK) || n > MaxSessionID || !utf8.ValidString(id) {
		return apierr.BadRequest("session_id must be 1 to %d characters", MaxSessionID)
	}
	return nil
}

// StartTurn starts a run in a session and returns it with the caller
// attached. It refuses before any event: a bad request (400), a session
// with a turn in flight (busy 409), too many paused runs (busy 503), an
// agent that cannot be reached or refuses the session (turn_failed 502).
func (d *Daemon) StartTurn(ctx context.Context, req *pb.StartTurnRequest) (*run, error) {
	if err := checkSessionID(req.GetSessionId(), true); err != nil {
		return nil, err
	}
	prompt := req.GetPrompt()
	if !utf8.ValidString(prompt) || utf8.RuneCountInString(prompt) > MaxPrompt {
		return nil, apierr.BadRequest("prompt must be valid UTF-8 of at most %d characters", MaxPrompt)
	}
	mode := req.GetApprovalMode()
	switch mode {
	case pb.ApprovalMode_APPROVAL_MODE_MANUAL, pb.ApprovalMode_APPROVAL_MODE_SELF_DRIVE:
	case pb.ApprovalMode_APPROVAL_MODE_UNSPECIFIED:
		// The spec's default is self-drive.
		mode = pb.ApprovalMode_APPROVAL_MODE_SELF_DRIVE
	default:
		return nil, apierr.BadRequest("unknown approval_mode %d", mode)
	}
	id := req.GetSessionId()
	named := id == "" // by the daemon: a fresh random id, nothing stored under it
	if named {
		id = uuid.NewString()
	}

	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the intern is shutting down")
	}
	caller := req.GetCaller()
	if len(caller) > 128 {
		d.mu.Unlock()
		return nil, apierr.BadRequest("caller must be at most 128 characters")
	}
	if err := d.pauseRoom(); err != nil {
		d.mu.Unlock()
		return nil, err
	}
	s := d.sessions[id]
	if s == nil {
		var rec *sessionRecord
		if !named {
			var err error
			rec, err = d.store.load(id)
			if err != nil {
				d.log.Error("session file unreadable; the session starts afresh", "err", err)
			}
		}
		if rec == nil {
			now := d.now().UTC()
			rec = &sessionRecord{ID: id, CreatedAt: now, UpdatedAt: now}
		}
		s = &session{rec: rec, byIA: map[string]*run{}, unsaved: named}
		d.sessions[id] = s
	}
	s.used = d.now()
	if s.busy {
		cur := s.current
		d.mu.Unlock()
		return nil, busyError(cur)
	}
	s.busy = true
	d.mu.Unlock()

	release := func() {
		d.mu.Lock()
		s.busy = false
		d.mu.Unlock()
	}
	a, err := d.ensureAgent(ctx)
	if err != nil {
		release()
		return nil, err
	}
	acpID, err := d.ensureSession(ctx, a, s)
	if err != nil {
		release()
		return nil, err
	}

	r := d.newRun(ctx, s, mode, prompt)
	r.caller = caller
	r.detached = req.GetDetached()
	r.attached, r.log.pin = true, 1
	r.add(&pb.RunEvent{Event: &pb.RunEvent_Started{Started: &pb.Started{SessionId: id, RunId: r.id}}})
	d.mu.Lock()
	if d.closed {
		s.busy = false
		d.mu.Unlock()
		return nil, apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the intern is shutting down")
	}
	d.turns.Add(1)
	s.current = r
	s.runs = append(s.runs, r)
	if len(s.runs) > runsPerSession {
		old := s.runs[0]
		s.runs = s.runs[1:]
		for ia, rr := range s.byIA {
			if rr == old {
				delete(s.byIA, ia)
			}
		}
	}
	d.mu.Unlock()
	d.live.Add(1)
	go d.runTurn(a, r, acpID, prompt)
	return r, nil
}

// Answer validates an answer to a pending interaction and, when accepted,
// continues the run with the caller attached; it returns the run and the
// seq the caller's stream starts from.
func (d *Daemon) Answer(ctx context.Context, req *pb.AnswerRequest) (*run, uint64, error) {
	if err := checkSessionID(req.GetSessionId(), false); err != nil {
		return nil, 0, err
	}
	iaID := req.GetInteractionId()
	if n := utf8.RuneCountInString(iaID); n == 0 || n > MaxInteractionID {
		return nil, 0, apierr.BadRequest("interaction_id must be 1 to %d characters", MaxInteractionID)
	}
	d.mu.Lock()
	var r *run
	if s := d.sessions[req.GetSessionId()]; s != nil {
		r = s.byIA[iaID]
		s.used = d.now()
	}
	d.mu.Unlock()
	if r == nil {
		if d.store.asked(req.GetSessionId(), iaID) {
			// Asked by a run this daemon process no longer holds (it
			// restarted, or the run aged out of memory): it has ended.
			return nil, 0, apierr.Conflict(apierr.ReasonInteractionNotPending, "the question is no longer waiting")
		}
		return nil, 0, apierr.New(http.StatusNotFound, apierr.ReasonInteractionUnknown, "no pending question in this session has this id")
	}
	return r.answer(iaID, req.GetAnswer(), req.GetDetached())
}

// Attach attaches the caller to a run from a sequence number.
func (d *Daemon) Attach(req *pb.AttachRequest) (*run, error) {
	d.mu.Lock()
	var r *run
	if s := d.sessions[req.GetSessionId()]; s != nil {
		s.used = d.now()
		for _, rr := range s.runs {
			if rr.id == req.GetRunId() {
				r = rr
			}
		}
	}
	d.mu.Unlock()
	if r == nil {
		return nil, apierr.NotFound("no run %q in this session", req.GetRunId())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attached {
		return nil, apierr.Conflict(apierr.ReasonAttachmentFailed, "another request is already attached to the run")
	}
	if _, _, err := r.log.since(req.GetFromSeq()); err != nil {
		return nil, err
	}
	if r.state == stateDone && max(req.GetFromSeq(), 1) >= r.log.next {
		return nil, apierr.New(http.StatusGone, apierr.ReasonAttachmentFailed, "the run has ended: there is nothing more to stream from %d", req.GetFromSeq())
	}
	r.attached, r.log.pin = true, max(req.GetFromSeq(), 1)
	return r, nil
}

// Cancel cancels the session's current run and reports whether there was one.
func (d *Daemon) Cancel(req *pb.CancelRequest) bool {
	d.mu.Lock()
	var r *run
	if s := d.sessions[req.GetSessionId()]; s != nil && s.busy {
		r = s.current
	}
	d.mu.Unlock()
	if r == nil {
		return false
	}
	return d.cancelRun(r, nil)
}

// turnDone frees the session and records the turn.
func (d *Daemon) turnDone(r *run, reply, end string) {
	now := d.now().UTC()
	d.mu.Lock()
	s := r.sess
	s.busy = false
	s.rec.UpdatedAt = now
	head := *s.rec
	d.mu.Unlock()
	defer d.trimSessions()
	err := d.store.update(head.ID, func(rec *sessionRecord) {
		rec.ACPSessionID, rec.UpdatedAt = head.ACPSessionID, now
		if rec.CreatedAt.IsZero() {
			rec.CreatedAt = head.CreatedAt
		}
		rec.addTurn(turnRecord{RunID: r.id, Prompt: r.prompt, Reply: reply, End: end, At: now})
	})
	if err != nil {
		d.log.Error("save session", "err", err)
	}
}

func errTurnFailed(format string, args ...any) *apierr.Error {
	return apierr.New(http.StatusBadGateway, apierr.ReasonTurnFailed, format, args...)
}

func errRunEnded(msg string) *apierr.Error {
	return apierr.New(http.StatusGone, apierr.ReasonRunEnded, "%s", msg)
}

var _ = fmt.Sprintf

var (
	errPausedFull  = apierr.New(http.StatusServiceUnavailable, apierr.ReasonBusy, "the intern cannot hold another run open across a question now; retry later").Retry(apierr.RetryPaused)
	errCallerFull  = apierr.New(http.StatusServiceUnavailable, apierr.ReasonBusy, "you hold as many runs paused on a question as one caller may; answer or cancel one, or retry later").Retry(apierr.RetryPaused)
	errSessionBusy = apierr.Conflict(apierr.ReasonBusy, "another turn is running in this session").Retry(apierr.RetryBusySession)
)

// busyError is the 409 for a session that holds a turn. A run paused on
// a question is not "running": it waits for the caller, and a new prompt
// will not get through until that question is answered, so the message
// names the pending interaction (the tool_call_id the caller was given).
func busyError(cur *run) *apierr.Error {
	if cur == nil {
		return errSessionBusy
	}
	cur.mu.Lock()
	var id string
	if cur.state == statePaused && cur.pending != nil {
		id = cur.pending.id
	}
	cur.mu.Unlock()
	if id == "" {
		return errSessionBusy
	}
	return apierr.Conflict(apierr.ReasonBusy, "this session is paused waiting for an answer to interaction %q; answer it with a tool message whose tool_call_id is %q (or cancel the run) before sending a new prompt", id, id).Retry(apierr.RetryBusySession)
}

// pauseRoom refuses a turn that could not pause because the intern's
// paused runs are at their bound. A caller at its own share still starts
// turns: the share bounds pauses, not turns, and a run of that caller that
// asks a question fails busy then (reservePause).
func (d *Daemon) pauseRoom() error {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	if int(d.paused.Load()) >= d.cfg.MaxPausedRuns {
		return errPausedFull
	}
	return nil
}

// reservePause takes a paused slot for a run of caller.
func (d *Daemon) reservePause(caller string) error {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	if int(d.paused.Load()) >= d.cfg.MaxPausedRuns {
		return errPausedFull
	}
	if caller != "" {
		if d.pausedBy[caller] >= d.cfg.MaxPausedPerCaller {
			return errCallerFull
		}
		if d.pausedBy == nil {
			d.pausedBy = map[string]int{}
		}
		d.pausedBy[caller]++
	}
	d.paused.Add(1)
	return nil
}

// releasePause gives a paused slot back.
func (d *Daemon) releasePause(caller string) {
	d.pmu.Lock()
	defer d.pmu.Unlock()
	d.paused.Add(-1)
	if caller != "" {
		if n := d.pausedBy[caller] - 1; n > 0 {
			d.pausedBy[caller] = n
		} else {
			delete(d.pausedBy, caller)
		}
	}
}

// trimSessions tells the bound how many sessions there are (idle.Bound.Trim).
func (d *Daemon) trimSessions() {
	d.mu.Lock()
	n := len(d.sessions)
	d.mu.Unlock()
	d.idle.Trim(n)
}

// forget drops from memory the sessions used before cutoff and, when
// extra > 0, that many more of the least recently used: only those no
// turn is in or paused on, every run ended and detached. It returns how
// many it dropped. Their files stay; a later turn reads them again (and
// loads the agent's session again), a late answer is told the question
// ended. idle.Bound calls it: a sweep of the sessions idle for
// SessionIdleTTL, a trim past MaxIdleSessions.
func (d *Daemon) forget(cutoff time.Time, extra int) int {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return 0
	}
	type candidate struct {
		s    *session
		runs []*run
		used time.Time
	}
	var idle, rest []candidate
	for _, s := range d.sessions {
		switch {
		case s.busy:
		case s.used.Before(cutoff):
			idle = append(idle, candidate{s, append([]*run(nil), s.runs...), s.used})
		case extra > 0:
			rest = append(rest, candidate{s, append([]*run(nil), s.runs...), s.used})
		}
	}
	d.mu.Unlock()
	if extra > 0 {
		slices.SortFunc(rest, func(a, b candidate) int { return a.used.Compare(b.used) })
		idle = append(idle, rest...)
	}
	var gone []*session
	for _, c := range idle {
		s := c.s
		if len(gone) >= extra && !c.used.Before(cutoff) {
			continue
		}
		if !quiet(c.runs) { // runs' own locks, never under d.mu
			continue
		}
		d.mu.Lock()
		// Unused since it was picked: no turn came (and went) meanwhile.
		if d.sessions[s.rec.ID] == s && !s.busy && s.used.Equal(c.used) {
			delete(d.sessions, s.rec.ID)
			if acp := s.rec.ACPSessionID; acp != "" && d.byACP[acp] == s {
				delete(d.byACP, acp)
			}
			gone = append(gone, s)
		}
		d.mu.Unlock()
	}
	for _, s := range gone {
		d.tools.unbind(s)
		for _, r := range s.runs {
			r.mu.Lock()
			r.log.forget() // no one can attach any more
			if r.expiry != nil {
				r.expiry.Stop()
			}
			r.mu.Unlock()
		}
	}
	return len(gone)
}

// quiet reports whether every run has ended and nobody reads it.
func quiet(runs []*run) bool {
	for _, r := range runs {
		r.mu.Lock()
		busy := r.state != stateDone || r.attached
		r.mu.Unlock()
		if busy {
			return false
		}
	}
	return true
}
