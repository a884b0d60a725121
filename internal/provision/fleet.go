package provision

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/store"
)

// The reconciler. The database says which interns should be awake
// (provisioning or running); the backend says which daemons exist. One
// reconciler makes them match, woken by every change (the API's hook,
// PostgreSQL notifications of any writer, the operator's CLI included, the
// backend's own events) and by a sweep that also serves SQLite. It alone
// decides: it starts what should run (within MaxAwake, evicting the least
// recently used idle intern), puts idle interns to sleep (their daemons
// gone, their files kept) and wakes them for the next turn, adopts what a
// previous gateway left, and restarts a daemon that died after a doubling
// back-off. Nothing else starts or stops a daemon: the API hook, a wake and
// a sleep only change the row and reconcile.

// Defaults of the fleet's knobs.
const (
	DefaultStartConcurrency = 4
	DefaultSweep            = time.Second
)

// busyRetry is how long the reconciler leaves an intern another replica
// acts on (or whose daemon an operator has yet to register); a holder that
// died is taken over within it of its claim's expiry.
const busyRetry = 2 * time.Second

// maxBackoff caps the restart back-off.
const maxBackoff = 30 * time.Second

// ErrNoRoom is the refusal of a wake when every awake intern is busy and
// the fleet is at MaxAwake.
var ErrNoRoom = apierr.New(http.StatusServiceUnavailable, apierr.ReasonBusy, "every awake intern is busy and this host runs as many as it may; retry later").Retry(apierr.RetryNoRoom)

// fleet is the reconciler's state.
type fleet struct {
	// rec serializes decisions that count the awake interns: a pass, a
	// wake's admission, a sleep.
	rec  sync.Mutex
	kick chan struct{}
	sem  chan struct{} // bounds daemons starting at once

	mu       sync.Mutex
	stop     context.CancelFunc
	isClosed bool
	loops    sync.WaitGroup
	acting   map[string]*action
	interns  map[string]*memory
}

// memory is what the reconciler remembers of one intern on this gateway.
type memory struct {
	lastUsed time.Time // this gateway's last call to its daemon
	open     int       // streams from the daemon being read
	nextLook time.Time // not idle before then (used through another replica)
	upAt     time.Time // when this gateway last saw its daemon come up
	retryAt  time.Time // no start before then (back-off)
	backoff  time.Duration
	leaving  bool // put to sleep, its daemon not yet gone
}

// action is the reconciler's work on one intern; concurrent callers share it.
type action struct {
	done  chan struct{}
	err   error
	start bool // it starts a daemon (counts as awake)
}

func (f *fleet) init(concurrency int) {
	f.kick = make(chan struct{}, 1)
	f.sem = make(chan struct{}, concurrency)
	f.acting = map[string]*action{}
	f.interns = map[string]*memory{}
}

// begin returns the context of the reconciler's work.
func (f *fleet) begin() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	f.mu.Lock()
	f.stop = cancel
	f.mu.Unlock()
	return ctx
}

func (f *fleet) closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.isClosed
}

// end stops the reconciler and waits for its work; true the first time.
func (f *fleet) end() bool {
	f.mu.Lock()
	if f.isClosed {
		f.mu.Unlock()
		return false
	}
	f.isClosed = true
	stop := f.stop
	f.mu.Unlock()
	if stop != nil {
		stop()
	}
	f.loops.Wait()
	return true
}

// mem returns the intern's memory (under f.mu).
func (f *fleet) mem(id string) *memory {
	m := f.interns[id]
	if m == nil {
		m = &memory{}
		f.interns[id] = m
	}
	return m
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
func (p *Provisioner) runFleet(ctx context.Context) {
	f := &p.fleet
	f.loops.Add(1)
	go func() {
		defer f.loops.Done()
		t := time.NewTicker(p.sweepInterval())
		defer t.Stop()
		for {
			if err := p.reconcile(ctx); err != nil && ctx.Err() == nil {
				p.Log.Error("reconcile interns", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-f.kick:
			case <-t.C:
			}
		}
	}()
	if store.Notifies(p.DB) {
		f.loops.Add(1)
		go func() {
			defer f.loops.Done()
			p.listen(ctx)
		}()
	}
	if p.IdleTimeout > 0 {
		f.loops.Add(1)
		go func() {
			defer f.loops.Done()
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
	// A change may have landed before LISTEN took effect: nudge once ready.
	return store.Listen(ctx, p.DB, store.InternsChannel, p.nudge, p.nudge)
}

// specOf is what the intern's row asks its daemon to run (without its
// recorded daemon).
func specOf(in *store.Intern) Spec {
	return Spec{ID: in.ID, Model: in.Model, Agent: in.Agent, Limits: in.Limits}
}

// SecretTag names a wrapped daemon secret without revealing it.
func SecretTag(wrapped string) string {
	s := sha256.Sum256([]byte(wrapped))
	return hex.EncodeToString(s[:12])
}

// reconcile makes the backend match the database: a daemon for every
// intern in provisioning or running (within MaxAwake), running what its
// row says and recorded there; none for the others, and no files of a
// deleted intern.
func (p *Provisioner) reconcile(ctx context.Context) error {
	obs, complete := p.Backend.Observe()
	var rows []store.Intern
	// What a daemon runs with (Fingerprint compares it): a row read without
	// the limits would restart every daemon that has its own.
	if err := p.DB.NewSelect().Model(&rows).Column("id", "state", "daemon_url", "model", "agent",
		"limit_memory", "limit_processes", "limit_cpu_weight", "limit_cpus", "limit_tmpfs", "limit_disk").
		Where("state IN (?)", bun.List([]string{store.InternProvisioning, store.InternRunning})).Scan(ctx); err != nil {
		return err
	}
	f := &p.fleet
	f.rec.Lock()
	defer f.rec.Unlock()
	obsOf := make(map[string]*Observed, len(obs))
	for i := range obs {
		obsOf[obs[i].ID] = &obs[i]
	}
	want := make(map[string]bool, len(rows))
	now := time.Now()
	for i := range rows {
		in := &rows[i]
		want[in.ID] = true
		o := obsOf[in.ID]
		missing := o == nil || !o.Running
		needs := in.State == store.InternProvisioning ||
			(complete && (missing || !o.Ready || o.URL != in.DaemonURL || o.Runs != p.Backend.Fingerprint(specOf(in))))
		if !needs {
			continue
		}
		if missing && complete && !p.gone(in.ID) {
			continue // it came up since the look above
		}
		f.mu.Lock()
		m := f.mem(in.ID)
		acting := f.acting[in.ID] != nil
		if !acting && complete && missing && !m.upAt.IsZero() {
			// The daemon this gateway saw come up is gone: it starts again
			// after the back-off.
			if now.Sub(m.upAt) > time.Minute || m.backoff == 0 {
				m.backoff = p.RestartBackoff
			}
			p.Log.Error("intern daemon stopped; restarting", "intern", in.ID, "in", m.backoff)
			m.upAt, m.retryAt, m.backoff = time.Time{}, now.Add(m.backoff), min(m.backoff*2, maxBackoff)
		}
		wait := now.Before(m.retryAt)
		f.mu.Unlock()
		if acting || wait {
			continue
		}
		if missing && !p.room(ctx, obs) {
			continue // at MaxAwake with every awake intern busy: a later pass
		}
		p.act(in.ID, true)
	}
	// What exists for interns that should not be awake: whose rows say so
	// (or are gone) is read in one query.
	var others []string
	for _, o := range obs {
		if !want[o.ID] {
			others = append(others, o.ID)
		}
	}
	if len(others) == 0 {
		return nil
	}
	var states []store.Intern
	if err := p.DB.NewSelect().Model(&states).Column("id", "state").Where("id IN (?)", bun.List(others)).Scan(ctx); err != nil {
		return err
	}
	state := make(map[string]string, len(states))
	for _, s := range states {
		state[s.ID] = s.State
	}
	for _, id := range others {
		st, ok := state[id]
		if ok && st != store.InternDeleted && !obsOf[id].Running {
			continue // asleep or suspended: its files stay
		}
		f.mu.Lock()
		wait := f.acting[id] != nil || now.Before(f.mem(id).retryAt)
		f.mu.Unlock()
		if !wait {
			p.act(id, false)
		}
	}
	return nil
}

// gone reports whether the backend sees no daemon of the intern now.
func (p *Provisioner) gone(id string) bool {
	obs, _ := p.Backend.Observe()
	for _, o := range obs {
		if o.ID == id && o.Running {
			return false
		}
	}
	return true
}

// current reports whether the backend sees the running intern's daemon
// ready where its row says, running what its row says.
func (p *Provisioner) current(in *store.Intern) bool {
	obs, complete := p.Backend.Observe()
	if !complete {
		return false
	}
	for _, o := range obs {
		if o.ID == in.ID {
			return o.Running && o.Ready && o.URL == in.DaemonURL && o.Runs == p.Backend.Fingerprint(specOf(in))
		}
	}
	return false
}

// awake reports whether the intern's daemon exists or is being started.
func (p *Provisioner) awake(id string, obs []Observed) bool {
	f := &p.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	if a := f.acting[id]; a != nil && a.start {
		return true
	}
	for _, o := range obs {
		if o.ID == id && o.Running {
			return !f.mem(id).leaving
		}
	}
	return false
}

// room reports whether one more intern may be awake, putting the least
// recently used idle one to sleep if the fleet is at MaxAwake. Called with
// fleet.rec held.
func (p *Provisioner) room(ctx context.Context, obs []Observed) bool {
	if p.MaxAwake <= 0 {
		return true
	}
	f := &p.fleet
	type cand struct {
		o    Observed
		used time.Time
	}
	var cands []cand
	f.mu.Lock()
	n := 0
	counted := map[string]bool{}
	for id, a := range f.acting {
		if a.start {
			counted[id] = true
			n++
		}
	}
	for _, o := range obs {
		m := f.mem(o.ID)
		if !o.Running || m.leaving || counted[o.ID] {
			continue
		}
		n++
		if o.Ready && m.open == 0 {
			cands = append(cands, cand{o, m.lastUsed})
		}
	}
	f.mu.Unlock()
	if n < p.MaxAwake {
		return true
	}
	sort.Slice(cands, func(i, j int) bool {
		return later(cands[i].used, cands[i].o.Since).Before(later(cands[j].used, cands[j].o.Since))
	})
	for _, c := range cands {
		if p.trySleep(ctx, c.o, c.used, false) {
			return true
		}
	}
	return false
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// sleepIdle puts to sleep every awake intern idle for IdleTimeout: not
// used by this gateway since, and, by its daemon's own count, by no other.
func (p *Provisioner) sleepIdle(ctx context.Context) {
	obs, _ := p.Backend.Observe()
	now := time.Now()
	cutoff := now.Add(-p.IdleTimeout)
	f := &p.fleet
	for _, o := range obs {
		if !o.Ready || !o.Running {
			continue
		}
		f.mu.Lock()
		m := f.mem(o.ID)
		used, skip := m.lastUsed, m.open > 0 || m.leaving || now.Before(m.nextLook) || f.acting[o.ID] != nil
		f.mu.Unlock()
		if skip || later(used, o.Since).After(cutoff) {
			continue
		}
		f.rec.Lock()
		p.trySleep(ctx, o, used, true)
		f.rec.Unlock()
	}
}

// trySleep puts o's intern to sleep unless its daemon holds a live or
// paused run, it was used since used, or (idle) its daemon was used through
// another replica within IdleTimeout. Called with fleet.rec held.
func (p *Provisioner) trySleep(ctx context.Context, o Observed, used time.Time, idle bool) bool {
	in, err := p.row(ctx, o.ID)
	if err != nil || in.State != store.InternRunning || in.DaemonURL != o.URL {
		return false
	}
	secret, err := p.unwrap(in)
	if err != nil {
		return false
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	st, err := p.dial("", o.URL, secret).Status(sctx, connect.NewRequest(&pb.StatusRequest{}))
	cancel()
	if err != nil || st.Msg.GetLiveRuns() > 0 || st.Msg.GetPausedRuns() > 0 {
		// A paused run waits for its caller until its interaction deadline;
		// a daemon that does not answer is the reconciler's to restart.
		return false
	}
	f := &p.fleet
	if d := time.Duration(st.Msg.GetIdleMs()) * time.Millisecond; idle && d < p.IdleTimeout {
		// Used through another replica: idle again at the soonest then.
		f.mu.Lock()
		f.mem(o.ID).nextLook = time.Now().Add(p.IdleTimeout - d)
		f.mu.Unlock()
		return false
	}
	f.mu.Lock()
	m := f.mem(o.ID)
	still := m.open == 0 && m.lastUsed.Equal(used) && f.acting[o.ID] == nil
	f.mu.Unlock()
	if !still {
		return false
	}
	res, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("state = ?", store.InternSleeping).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state = ? AND daemon_url = ?", o.ID, store.InternRunning, o.URL).Exec(ctx)
	if err != nil {
		p.Log.Error("put intern to sleep", "intern", o.ID, "err", err)
		return false
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return false
	}
	p.Log.Info("intern asleep", "intern", o.ID, "idle", time.Since(later(used, o.Since)).Round(time.Second).String())
	f.mu.Lock()
	f.mem(o.ID).leaving = true
	f.mu.Unlock()
	p.act(o.ID, false)
	return true
}

// act makes the backend match the intern's row now, unless the reconciler
// already acts on it, in which case the caller shares that action. start:
// the caller expects a daemon to start (it counts as awake meanwhile).
func (p *Provisioner) act(id string, start bool) *action {
	f := &p.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	if a := f.acting[id]; a != nil {
		a.start = a.start || start
		return a
	}
	a := &action{done: make(chan struct{}), start: start}
	if f.isClosed || f.stop == nil {
		a.err = errors.New("the gateway is stopping")
		close(a.done)
		return a
	}
	f.acting[id] = a
	ctx := p.fleetCtx
	f.loops.Add(1)
	go func() {
		defer f.loops.Done()
		err := p.carry(ctx, id)
		f.mu.Lock()
		delete(f.acting, id)
		m := f.mem(id)
		m.leaving = false
		switch {
		case err == nil:
		case errors.Is(err, ErrBusy) || errors.Is(err, ErrUnhosted):
			m.retryAt = time.Now().Add(busyRetry)
		case ctx.Err() == nil:
			if m.backoff == 0 {
				m.backoff = p.RestartBackoff
			}
			p.Log.Error("intern daemon did not start", "intern", id, "err", err, "retry_in", m.backoff)
			m.retryAt, m.backoff = time.Now().Add(m.backoff), min(m.backoff*2, maxBackoff)
		}
		a.err = err
		f.mu.Unlock()
		close(a.done)
		// The row may have changed while the action ran on what it read
		// (a resume during a suspend's stop): a pass looks again.
		p.nudge()
	}()
	return a
}

// carry does what the intern's row asks of the backend, holding its claim.
func (p *Provisioner) carry(ctx context.Context, id string) error {
	release, err := p.Backend.Claim(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	// The row may have changed since whoever called looked.
	in, err := p.row(ctx, id)
	gone := func() {
		p.fleet.mu.Lock()
		delete(p.fleet.interns, id)
		p.fleet.mu.Unlock()
	}
	switch {
	case errors.Is(err, sql.ErrNoRows) || (err == nil && in.State == store.InternDeleted):
		gone()
		return p.Backend.Remove(ctx, id)
	case err != nil:
		return err
	case in.State == store.InternRunning && p.current(in):
		return nil // the daemon came up since whoever called looked
	case in.State == store.InternProvisioning || in.State == store.InternRunning:
		return p.ensure(ctx, in)
	default:
		p.fleet.mu.Lock()
		m := p.fleet.mem(id)
		m.upAt, m.open, m.nextLook = time.Time{}, 0, time.Time{}
		p.fleet.mu.Unlock()
		return p.Backend.Sleep(ctx, id)
	}
}

// ensure has the backend run the intern's daemon, checks it answers and
// records it in the row, which then says running.
func (p *Provisioner) ensure(ctx context.Context, in *store.Intern) error {
	b := p.Backend
	spec := specOf(in)
	wrapped := in.DaemonSecret
	if in.Provisioner == b.Name() && wrapped != "" {
		if secret, err := p.unwrap(in); err == nil {
			spec.URL, spec.Secret, spec.SecretTag = in.DaemonURL, secret, SecretTag(wrapped)
		}
	}
	spec.Mint = func(ctx context.Context) (string, string, error) {
		secret := NewSecret()
		w, err := p.wrap(in.ID, secret)
		if err != nil {
			return "", "", err
		}
		res, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
			Set("daemon_secret = ?", w).Set("daemon_url = ''").Set("provisioner = ?", b.Name()).
			Set("state = ?", store.InternProvisioning).Set("updated_at = ?", store.Now(nil)).
			Where("id = ? AND state IN (?)", in.ID, bun.List([]string{store.InternProvisioning, store.InternRunning})).Exec(ctx)
		if err != nil {
			return "", "", err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return "", "", ErrNotWanted
		}
		wrapped = w
		return secret, SecretTag(w), nil
	}
	if in.State == store.InternRunning {
		// Its daemon is gone, not ready or stale: chat waits instead of
		// dialing it.
		if _, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).Set("state = ?", store.InternProvisioning).
			Set("updated_at = ?", store.Now(nil)).Where("id = ? AND state = ?", in.ID, store.InternRunning).Exec(ctx); err != nil {
			return err
		}
	}
	// At most StartConcurrency daemons start at once; the slot is held
	// until this one answers (or fails).
	select {
	case p.fleet.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	d, err := b.Ensure(ctx, spec)
	if err == nil {
		if err = p.waitHealthy(ctx, d.URL, d.Secret); err != nil {
			// What does not answer goes; the next try starts afresh.
			b.Sleep(context.WithoutCancel(ctx), in.ID)
		}
	}
	<-p.fleet.sem
	if errors.Is(err, ErrNotWanted) {
		return nil
	}
	if err != nil {
		return err
	}
	res, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("daemon_url = ?", d.URL).Set("state = ?", store.InternRunning).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state = ? AND daemon_secret = ?", in.ID, store.InternProvisioning, wrapped).Exec(ctx)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		now := time.Now()
		p.fleet.mu.Lock()
		m := p.fleet.mem(in.ID)
		m.upAt, m.lastUsed = now, now
		p.fleet.mu.Unlock()
		p.Log.Info("intern daemon running", append([]any{"intern", in.ID, "url", d.URL}, d.Log...)...)
	}
	return nil
}

// waitHealthy polls the daemon's Status with its secret.
func (p *Provisioner) waitHealthy(ctx context.Context, base, secret string) error {
	ctx, cancel := context.WithTimeout(ctx, p.HealthTimeout)
	defer cancel()
	c := p.dial("", base, secret)
	for {
		_, err := c.Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the daemon did not become healthy: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Wake returns the intern's row once its daemon runs: a sleeping intern is
// woken (concurrent callers share one wake), a starting one waited for. An
// intern whose daemon the backend cannot start (remote, unregistered) comes
// back as it is.
func (p *Provisioner) Wake(ctx context.Context, in *store.Intern) (_ *store.Intern, err error) {
	p.init()
	if in.State != store.InternSleeping && in.State != store.InternProvisioning {
		return in, nil
	}
	woke := in.State == store.InternSleeping
	if woke && p.OnWake != nil {
		began := time.Now()
		defer func() { p.OnWake(time.Since(began), err == nil) }()
	}
	ctx, cancel := context.WithTimeout(ctx, p.WakeTimeout)
	defer cancel()
	f := &p.fleet
	f.rec.Lock()
	obs, _ := p.Backend.Observe()
	if !p.awake(in.ID, obs) && !p.room(ctx, obs) {
		f.rec.Unlock()
		return nil, ErrNoRoom
	}
	_, err = p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("state = ?", store.InternProvisioning).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state = ?", in.ID, store.InternSleeping).Exec(ctx)
	f.rec.Unlock()
	if err != nil {
		return nil, errUnreachable.WithCause(err)
	}
	late := func() error {
		return apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the intern could not be woken in time").WithCause(ctx.Err())
	}
	for {
		a := p.act(in.ID, true)
		select {
		case <-a.done:
		case <-ctx.Done():
			return nil, late()
		}
		switch {
		case errors.Is(a.err, ErrUnhosted):
			return p.row(ctx, in.ID)
		case a.err != nil && !errors.Is(a.err, ErrBusy):
			if woke {
				p.wakeFailed(in.ID)
			}
			return nil, wakeError(a.err)
		}
		// Another replica acts (ErrBusy): the row is read often, the
		// action tried again once a second. Otherwise the shared action
		// ended before this wake's row changed: act again.
		tries := 1
		if a.err != nil {
			tries = 10
		}
		for range tries {
			row, err := p.row(ctx, in.ID)
			if err != nil {
				return nil, errUnreachable.WithCause(err)
			}
			if row.State != store.InternProvisioning {
				return row, nil // running, or suspended or deleted meanwhile
			}
			select {
			case <-ctx.Done():
				return nil, late()
			case <-time.After(time.Duration(tries) * 10 * time.Millisecond):
			}
		}
	}
}

// wakeFailed puts an intern whose daemon did not start back to sleep, so
// the next turn tries a fresh start instead of waiting on a back-off.
func (p *Provisioner) wakeFailed(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("state = ?", store.InternSleeping).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state = ?", id, store.InternProvisioning).Exec(ctx); err != nil {
		p.Log.Error("put intern back to sleep", "intern", id, "err", err)
		return
	}
	p.fleet.mu.Lock()
	p.fleet.mem(id).retryAt = time.Time{}
	p.fleet.mu.Unlock()
	p.nudge()
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
	f := &p.fleet
	f.mu.Lock()
	m := f.mem(id)
	m.lastUsed = time.Now()
	m.open = max(m.open+open, 0)
	f.mu.Unlock()
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

// errUnreachable is the chat's refusal when a daemon cannot be reached.
var errUnreachable = apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the intern could not be reached")

// wakeError is the caller's error for a wake that failed. Most causes are
// the operator's to read in the log; an agent the catalog no longer allows
// is the caller's to act on (pick another agent), so its reason is named.
func wakeError(cause error) *apierr.Error {
	var na *agents.NotAllowedError
	if errors.As(cause, &na) {
		return apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the intern could not be woken: %s", na.Error()).WithCause(cause)
	}
	return apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the intern could not be woken").WithCause(cause)
}
