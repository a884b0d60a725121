package provision

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/store"
)

// The local fleet. The database says which interns should be awake
// (provisioning or running); one reconciler makes the supervisors match
// it, woken by every change (the API's hook, PostgreSQL notifications of
// any writer, the operator's CLI included) and by a sweep that also serves
// SQLite. Idle interns are put to sleep (state sleeping: their jails
// stopped, their sessions on disk) and woken by the next turn. Nothing else
// starts or stops a daemon: the API hook, a wake and a sleep only change
// the row and reconcile.

// Defaults of the fleet's knobs.
const (
	DefaultStartConcurrency = 4
	DefaultSweep            = time.Second
)

// ErrNoRoom is the refusal of a wake when every awake intern is busy and
// the fleet is at MaxAwake.
var ErrNoRoom = apierr.New(http.StatusServiceUnavailable, "busy", "every awake intern is busy and this host runs as many as it may; retry later").Retry(apierr.RetryNoRoom)

// fleet is the provisioner's reconciler state (local mode).
type fleet struct {
	// rec serializes decisions that read the database and act on the
	// supervisors: a reconcile, a sleep, a wake.
	rec  sync.Mutex
	kick chan struct{}
	stop context.CancelFunc
	done sync.WaitGroup
	sem  chan struct{} // bounds daemons starting at once
}

func (p *Provisioner) sweepInterval() time.Duration {
	if p.Sweep > 0 {
		return p.Sweep
	}
	return DefaultSweep
}

// nudge asks the reconciler for a pass soon.
func (p *Provisioner) nudge() {
	select {
	case p.fleet.kick <- struct{}{}:
	default:
	}
}

// runFleet starts the reconciler, the PostgreSQL listener and the sleeper.
func (p *Provisioner) runFleet() {
	ctx, cancel := context.WithCancel(context.Background())
	p.fleet.stop = cancel
	p.fleetCtx = ctx
	if p.kube != nil {
		p.kube.start(ctx)
	}
	p.fleet.done.Add(1)
	go func() {
		defer p.fleet.done.Done()
		t := time.NewTicker(p.sweepInterval())
		defer t.Stop()
		for {
			if err := p.reconcile(ctx); err != nil && ctx.Err() == nil {
				p.Log.Error("reconcile interns", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-p.fleet.kick:
			case <-t.C:
			}
		}
	}()
	if p.DB.Dialect().Name() == dialect.PG {
		p.fleet.done.Add(1)
		go func() {
			defer p.fleet.done.Done()
			p.listen(ctx)
		}()
	}
	if p.IdleTimeout > 0 {
		p.fleet.done.Add(1)
		go func() {
			defer p.fleet.done.Done()
			tick := min(max(p.IdleTimeout/4, 10*time.Millisecond), 5*time.Second)
			t := time.NewTicker(tick)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					p.sleepIdle(ctx)
				}
			}
		}()
	}
}

// listen nudges the reconciler on every notification of an intern change;
// on a lost connection it retries (the sweep covers the gap).
func (p *Provisioner) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := p.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		p.Log.Warn("intern notifications lost; listening again", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (p *Provisioner) listenOnce(ctx context.Context) error {
	conn, err := p.DB.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		pc, ok := store.PgxConn(dc)
		if !ok {
			return fmt.Errorf("not a pgx connection: %T", dc)
		}
		if _, err := pc.Exec(ctx, "LISTEN "+store.InternsChannel); err != nil {
			return err
		}
		// A change may have landed before LISTEN took effect.
		p.nudge()
		for {
			if _, err := pc.WaitForNotification(ctx); err != nil {
				if ctx.Err() != nil {
					// The connection is mid-wait: it cannot go back to the pool.
					return driver.ErrBadConn
				}
				return err
			}
			p.nudge()
		}
	})
}

// reconcile makes the supervisors match the database: a daemon for every
// intern in provisioning or running (within MaxAwake), none for the others.
func (p *Provisioner) reconcile(ctx context.Context) error {
	if p.kube != nil {
		return p.reconcileKube(ctx)
	}
	p.fleet.rec.Lock()
	defer p.fleet.rec.Unlock()
	var rows []store.Intern
	// What a jail runs with (localChanged compares it): a row read without
	// the limits would restart every jail that has its own.
	if err := p.DB.NewSelect().Model(&rows).Column("id", "state", "model", "agent",
		"limit_memory", "limit_processes", "limit_cpu_weight", "limit_cpus", "limit_tmpfs", "limit_disk").
		Where("state IN (?)", bun.In([]string{store.InternProvisioning, store.InternRunning})).Scan(ctx); err != nil {
		return err
	}
	want := make(map[string]bool, len(rows))
	for i := range rows {
		want[rows[i].ID] = true
	}
	p.mu.Lock()
	var gone []string
	for id := range p.sups {
		if !want[id] {
			gone = append(gone, id)
		}
	}
	p.mu.Unlock()
	for _, id := range gone {
		in := store.Intern{ID: id, State: store.InternDeleted}
		if err := p.DB.NewSelect().Model(&in).Where("id = ?", id).Scan(ctx); err != nil && !errors.Is(err, errNoRows) {
			return err
		}
		p.localChanged(&in)
	}
	for i := range rows {
		if !p.awake(rows[i].ID) && !p.room(ctx) {
			continue // at MaxAwake with every awake intern busy: a later pass
		}
		p.localChanged(&rows[i])
	}
	return nil
}

func (p *Provisioner) awake(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sups[id] != nil
}

// room reports whether one more intern may be awake, putting the least
// recently used idle one to sleep if the fleet is at MaxAwake. Called with
// fleet.rec held.
func (p *Provisioner) room(ctx context.Context) bool {
	if p.MaxAwake <= 0 {
		return true
	}
	p.mu.Lock()
	n := len(p.sups)
	type cand struct {
		s    *supervisor
		used time.Time
	}
	var cands []cand
	for _, s := range p.sups {
		if s.isUp() && s.open == 0 {
			cands = append(cands, cand{s, s.lastUsed})
		}
	}
	p.mu.Unlock()
	if n < p.MaxAwake {
		return true
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].used.Before(cands[j].used) })
	for _, c := range cands {
		if p.trySleep(ctx, c.s, c.used) {
			return true
		}
	}
	return false
}

// sleepIdle puts to sleep every awake intern idle for IdleTimeout.
func (p *Provisioner) sleepIdle(ctx context.Context) {
	if p.kube != nil {
		p.sleepIdleKube(ctx)
		return
	}
	cutoff := time.Now().Add(-p.IdleTimeout)
	p.mu.Lock()
	type cand struct {
		s    *supervisor
		used time.Time
	}
	var cands []cand
	for _, s := range p.sups {
		if s.isUp() && s.open == 0 && s.lastUsed.Before(cutoff) {
			cands = append(cands, cand{s, s.lastUsed})
		}
	}
	p.mu.Unlock()
	for _, c := range cands {
		p.fleet.rec.Lock()
		p.trySleep(ctx, c.s, c.used)
		p.fleet.rec.Unlock()
	}
}

// trySleep puts s's intern to sleep unless its daemon holds a live or
// paused run or it was used since used. Called with fleet.rec held.
func (p *Provisioner) trySleep(ctx context.Context, s *supervisor, used time.Time) bool {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := s.client().Status(sctx, connect.NewRequest(&pb.StatusRequest{}))
	if err != nil || st.Msg.GetLiveRuns() > 0 || st.Msg.GetPausedRuns() > 0 {
		// A paused run waits for its caller until its interaction deadline;
		// a daemon that does not answer is the supervisor's to restart.
		return false
	}
	p.mu.Lock()
	still := p.sups[s.id] == s && s.open == 0 && s.lastUsed.Equal(used)
	p.mu.Unlock()
	if !still {
		return false
	}
	res, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("state = ?", store.InternSleeping).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state = ?", s.id, store.InternRunning).Exec(ctx)
	if err != nil {
		p.Log.Error("put intern to sleep", "intern", s.id, "err", err)
		return false
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return false
	}
	p.Log.Info("intern asleep", "intern", s.id, "idle", time.Since(used).Round(time.Second).String())
	p.localChanged(&store.Intern{ID: s.id, State: store.InternSleeping})
	return true
}

// Wake returns the intern's row once its daemon runs: a sleeping intern is
// woken (concurrent callers share one wake), a starting one waited for.
// The remote provisioner cannot wake anything: the row comes back as is.
func (p *Provisioner) Wake(ctx context.Context, in *store.Intern) (_ *store.Intern, err error) {
	p.init()
	if p.Mode == Remote || (in.State != store.InternSleeping && in.State != store.InternProvisioning) {
		return in, nil
	}
	if in.State == store.InternSleeping && p.OnWake != nil {
		began := time.Now()
		defer func() { p.OnWake(time.Since(began), err == nil) }()
	}
	if p.kube != nil {
		return p.wakeKube(ctx, in)
	}
	p.fleet.rec.Lock()
	if !p.awake(in.ID) && !p.room(ctx) {
		p.fleet.rec.Unlock()
		return nil, ErrNoRoom
	}
	if _, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("state = ?", store.InternProvisioning).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state = ?", in.ID, store.InternSleeping).Exec(ctx); err != nil {
		p.fleet.rec.Unlock()
		return nil, errUnreachable.WithCause(err)
	}
	row, err := p.row(ctx, in.ID)
	if err != nil {
		p.fleet.rec.Unlock()
		return nil, errUnreachable.WithCause(err)
	}
	p.localChanged(row)
	p.mu.Lock()
	s := p.sups[in.ID]
	p.mu.Unlock()
	p.fleet.rec.Unlock()
	if s == nil {
		// Suspended or deleted meanwhile.
		return row, nil
	}
	select {
	case <-s.up:
	case <-s.failed:
		p.wakeFailed(s)
		return nil, wakeError(s.err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return p.row(ctx, in.ID)
}

// wakeFailed puts an intern whose daemon did not start back to sleep, so
// the next turn tries a fresh start instead of waiting on this one's
// backoff.
func (p *Provisioner) wakeFailed(s *supervisor) {
	p.fleet.rec.Lock()
	defer p.fleet.rec.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("state = ?", store.InternSleeping).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state = ?", s.id, store.InternProvisioning).Exec(ctx)
	if err != nil {
		p.Log.Error("put intern back to sleep", "intern", s.id, "err", err)
		return
	}
	if n, _ := res.RowsAffected(); n == 1 {
		p.localChanged(&store.Intern{ID: s.id, State: store.InternSleeping})
	}
}

func (p *Provisioner) row(ctx context.Context, id string) (*store.Intern, error) {
	var in store.Intern
	if err := p.DB.NewSelect().Model(&in).Where("id = ?", id).Scan(ctx); err != nil {
		return nil, err
	}
	return &in, nil
}

// used records a call to the intern's daemon (open: +1 when a stream
// starts, -1 when it ends): a used intern is not idle.
func (p *Provisioner) used(id string, open int) {
	if k := p.kube; k != nil {
		k.mu.Lock()
		k.used[id] = time.Now()
		k.mu.Unlock()
		return
	}
	p.mu.Lock()
	if s := p.sups[id]; s != nil {
		s.lastUsed = time.Now()
		s.open += open
	}
	p.mu.Unlock()
}

// activity is the client interceptor that reports calls to p.used.
type activity struct {
	p  *Provisioner
	id string
}

func (a activity) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		a.p.used(a.id, 0)
		return next(ctx, req)
	}
}

func (a activity) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		a.p.used(a.id, 1)
		return &trackedConn{StreamingClientConn: next(ctx, spec), done: func() { a.p.used(a.id, -1) }}
	}
}

func (a activity) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// trackedConn reports the end of a stream once.
type trackedConn struct {
	connect.StreamingClientConn
	once sync.Once
	done func()
}

func (c *trackedConn) CloseResponse() error {
	err := c.StreamingClientConn.CloseResponse()
	c.once.Do(c.done)
	return err
}

var errNoRows = sql.ErrNoRows

// errUnreachable is the chat's refusal when a daemon cannot be reached.
var errUnreachable = apierr.New(http.StatusBadGateway, "intern_unreachable", "the intern could not be reached")

// wakeError is the caller's error for a wake that failed. Most causes are
// the operator's to read in the log; an agent the catalog no longer allows
// is the caller's to act on (pick another agent), so its reason is named.
func wakeError(cause error) *apierr.Error {
	var na *agents.NotAllowedError
	if errors.As(cause, &na) {
		return apierr.New(http.StatusBadGateway, "intern_unreachable", "the intern could not be woken: %s", na.Error()).WithCause(cause)
	}
	return apierr.New(http.StatusBadGateway, "intern_unreachable", "the intern could not be woken").WithCause(cause)
}
