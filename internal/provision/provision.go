// Package provision hosts interns: it starts, watches and stops their
// daemons (`cohort intern`) as intern records change, and gives the chat
// gateway an authenticated client for an intern's daemon.
//
// Two provisioners exist. `local` (the embedded default) starts one daemon
// per running intern as a child process on loopback, each with its own data
// directory (<data-dir>/interns/<id>) and its own secret, waits until it is
// healthy, marks the intern running and restarts the daemon if it dies.
// `remote` leaves running daemons to the operator, who registers each
// one's URL and secret (`cohort admin intern register`).
//
// Either way the daemon's URL and its secret (wrapped by the KEK) are in
// the intern's row, so any gateway replica can reach any daemon.
//
// The chat gateway reaches a daemon through Dialer:
//
//	c, err := srv.Provisioner.Client(ctx, intern) // intern_not_ready 409, intern_unreachable 502
//	st, err := c.StartTurn(ctx, connect.NewRequest(&interndv1.StartTurnRequest{...}))
//	for st.Receive() { ev := st.Msg().GetEvent() … } // a refusal arrives as st.Err()
//	e := apierr.FromConnect(st.Err())                 // the daemon's status and reason
package provision

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/h2coalesce"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/lookahead"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

// Provisioner modes.
const (
	Local  = "local"
	Remote = "remote"
)

// Dialer is what the chat gateway needs: an authenticated client for an
// intern's daemon. *Provisioner implements it.
type Dialer interface {
	Client(ctx context.Context, intern *store.Intern) (interndv1connect.InternDaemonServiceClient, error)
}

// Provisioner implements interns.Lifecycle and Dialer.
type Provisioner struct {
	DB  *bun.DB
	KEK *envelope.KEK
	Log *slog.Logger
	// Mode is Local or Remote.
	Mode string
	// DataDir is the gateway's data directory; local daemons live under
	// <DataDir>/interns/<id>.
	DataDir string
	// Command runs `cohort intern` (local); default: this executable.
	Command []string
	// GatewayURL, when set, is passed to local daemons as --gateway-url:
	// where their http_request tool reaches the vault.
	GatewayURL string
	// AgentCommand, when set, is passed to local daemons as --agent-command:
	// what an intern runs whose agent is the built-in one.
	AgentCommand string
	// Agents is the operator's catalog: what an intern's agent name runs.
	Agents agents.Catalog
	// ModelKey releases an intern's vault secret name for a request to
	// host: the model key of a third-party agent, which the model relay
	// puts in place of the placeholder (vault.Service.Release).
	ModelKey func(ctx context.Context, internID, name, host string) (string, error)
	// InteractionDeadline, when set, is passed to local daemons as
	// --interaction-deadline.
	InteractionDeadline time.Duration
	// HTTPToolCAFile, when set, is PEM the daemons' http_request trusts
	// besides the system roots (a jail gets its content, read-only).
	HTTPToolCAFile string
	// HealthTimeout bounds a local daemon's start (default 30 s).
	HealthTimeout time.Duration
	// RestartBackoff is the first delay before restarting a dead daemon
	// (default 1 s, doubling up to 30 s).
	RestartBackoff time.Duration
	// Jail, when set, runs each local daemon in a jail of its own (what
	// serve does unless --unsafe-shared-host); nil runs them as plain
	// children on the gateway's host.
	Jail *JailConfig
	// IdleTimeout puts a local intern to sleep after this long without a
	// call to its daemon, a live or paused run or an open stream (0: never).
	IdleTimeout time.Duration
	// MaxAwake caps the awake local interns (0: no cap): at the cap the
	// least recently used idle one sleeps to admit another.
	MaxAwake int
	// StartConcurrency bounds local daemons starting at once (default 4).
	StartConcurrency int
	// Sweep is how often the reconciler reads the database even without a
	// change notification (default 1 s).
	Sweep time.Duration
	// OnWake, when set, is told of every wake of a sleeping intern: how
	// long it took and whether it worked (internal/metrics).
	OnWake func(took time.Duration, ok bool)
	// Kube configures the Kubernetes mode (Mode == Kubernetes).
	Kube *KubeConfig
	// OnKubeCall, when set before Start, is told of every request to the
	// Kubernetes API (internal/metrics).
	OnKubeCall func(verb, resource string, code int)

	fleet    fleet
	kube     *kubeFleet
	kubeErr  error
	fleetCtx context.Context

	once   sync.Once
	client *http.Client

	// dialed caches the Connect client of each (intern, URL, wrapped
	// secret) seen: building one and unwrapping the secret cost more than
	// the rest of a turn's set-up. The key is the row as read from the
	// database on each request, so a changed URL or rotated secret misses;
	// no state is cached, only what a given row dials.
	dialMu sync.Mutex
	dialed map[dialKey]interndv1connect.InternDaemonServiceClient

	mu     sync.Mutex
	sups   map[string]*supervisor
	closed bool
	// leaving: Close lets go of the jails instead of stopping them, for
	// the next gateway to adopt (JailConfig.Orphan).
	leaving bool
}

func (p *Provisioner) init() {
	p.once.Do(func() {
		if p.Log == nil {
			p.Log = slog.New(slog.DiscardHandler)
		}
		if p.HealthTimeout <= 0 {
			p.HealthTimeout = 30 * time.Second
		}
		if p.RestartBackoff <= 0 {
			p.RestartBackoff = time.Second
		}
		p.sups = map[string]*supervisor{}
		p.fleetCtx = context.Background()
		if p.Mode == Kubernetes {
			p.kube = &kubeFleet{cfg: p.Kube}
			p.kubeErr = p.kube.init(p)
		}
		p.fleet.kick = make(chan struct{}, 1)
		p.fleet.sem = make(chan struct{}, cmp.Or(max(p.StartConcurrency, 0), DefaultStartConcurrency))
		// Daemons speak h2c (http://): one connection carries many run
		// streams. A remote daemon behind a TLS proxy (https://) gets HTTP/2.
		var protos http.Protocols
		protos.SetUnencryptedHTTP2(true)
		protos.SetHTTP2(true)
		// The lookahead lets a chat stream send the events that arrived
		// together in one write; the coalescing dialer sends a call's
		// headers and request in one write over h2c (every daemon method is
		// unary or server-streaming; under TLS it sees only records and
		// passes them through).
		p.client = &http.Client{Transport: lookahead.Transport{RoundTripper: telemetry.Transport(&http.Transport{Protocols: &protos,
			DialContext:         h2coalesce.Dialer(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}),
			MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second})}}
	})
}

// secretAD binds a wrapped daemon secret to its intern: a row's ciphertext
// copied onto another intern does not open.
func secretAD(internID string) []byte { return []byte("cohort/intern-daemon-secret/" + internID) }

// newSecret returns 32 random bytes, base64url.
func newSecret() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func (p *Provisioner) wrap(internID, secret string) (string, error) {
	ct, err := p.KEK.Wrap([]byte(secret), secretAD(internID))
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(ct), nil
}

func (p *Provisioner) unwrap(in *store.Intern) (string, error) {
	ct, err := base64.StdEncoding.DecodeString(in.DaemonSecret)
	if err != nil {
		return "", err
	}
	pt, err := p.KEK.Unwrap(ct, secretAD(in.ID))
	if err != nil {
		return "", err
	}
	return string(pt), nil
}

// Client returns an authenticated client for the intern's daemon, reading
// its URL and secret from the database (so it works on any replica). An
// intern that is not running is intern_not_ready 409; one without a
// reachable address is intern_unreachable 502.
func (p *Provisioner) Client(ctx context.Context, intern *store.Intern) (interndv1connect.InternDaemonServiceClient, error) {
	p.init()
	var in store.Intern
	if err := p.DB.NewSelect().Model(&in).Where("id = ?", intern.ID).Scan(ctx); err != nil {
		return nil, apierr.New(http.StatusBadGateway, "intern_unreachable", "the intern could not be reached").WithCause(err)
	}
	return p.ClientFor(&in)
}

// ClientFor is Client for a row the caller read from the database in this
// same request (the chat orchestration's interns.Load): it applies the
// same checks without reading the row a second time.
func (p *Provisioner) ClientFor(in *store.Intern) (interndv1connect.InternDaemonServiceClient, error) {
	p.init()
	if in.State != store.InternRunning {
		return nil, apierr.Conflict("intern_not_ready", "the intern is not running")
	}
	if in.DaemonURL == "" || in.DaemonSecret == "" {
		return nil, apierr.New(http.StatusBadGateway, "intern_unreachable", "the intern could not be reached")
	}
	k := dialKey{id: in.ID, url: in.DaemonURL, wrapped: in.DaemonSecret}
	p.dialMu.Lock()
	c, ok := p.dialed[k]
	p.dialMu.Unlock()
	if ok {
		return c, nil
	}
	secret, err := p.unwrap(in)
	if err != nil {
		return nil, apierr.New(http.StatusBadGateway, "intern_unreachable", "the intern could not be reached").WithCause(err)
	}
	c = p.dial(in.ID, in.DaemonURL, secret)
	p.dialMu.Lock()
	if p.dialed == nil || len(p.dialed) >= maxDialed {
		// Stale entries (old URLs, rotated secrets) are dropped wholesale;
		// the next turn of each live intern dials again.
		p.dialed = map[dialKey]interndv1connect.InternDaemonServiceClient{}
	}
	p.dialed[k] = c
	p.dialMu.Unlock()
	return c, nil
}

// dialKey identifies what a row dials: the wrapped secret is bound to the
// intern id, so the id is part of the key.
type dialKey struct{ id, url, wrapped string }

// maxDialed bounds the client cache.
const maxDialed = 4096

// dial returns a client of the daemon at base; calls through it count as
// the intern's activity (id, when set). It presents the gateway's
// credential, derived from the secret: replayed to the gateway by whatever
// captured it, it opens nothing (internd.GatewayCredential).
func (p *Provisioner) dial(id, base, secret string) interndv1connect.InternDaemonServiceClient {
	ics := []connect.Interceptor{bearerInterceptor("Bearer " + internd.GatewayCredential(secret))}
	if id != "" && p.Mode != Remote {
		ics = append(ics, activity{p, id})
	}
	return interndv1connect.NewInternDaemonServiceClient(p.client, base, connect.WithInterceptors(ics...))
}

// bearerInterceptor adds the daemon secret to every call.
type bearerInterceptor string

func (b bearerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b bearerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(b))
		return conn
	}
}

func (b bearerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Start (re)starts the daemons of interns in provisioning or running state,
// as the gateway comes up.
func (p *Provisioner) Start(ctx context.Context) error {
	p.init()
	switch p.Mode {
	case Remote:
	case Kubernetes:
		if p.kubeErr != nil {
			return p.kubeErr
		}
		// Pods outlive the gateway: the reconciler finds them as they are.
		p.startFleet()
		return nil
	default:
		// Jails a previous gateway left running are adopted as they are
		// (the reconciler attaches to them: their runs go on). Other
		// daemons of a previous gateway died with it. With sleep enabled,
		// their interns sleep (the next turn wakes each); otherwise they
		// start again and are provisioning (chat waits for them) until up,
		// never running at a dead address.
		live, err := p.liveJails(ctx)
		if err != nil {
			return err
		}
		to := store.InternProvisioning
		if p.IdleTimeout > 0 {
			to = store.InternSleeping
		}
		q := p.DB.NewUpdate().Model((*store.Intern)(nil)).
			Set("state = ?", to).Set("updated_at = ?", store.Now(nil)).
			Where("state = ?", store.InternRunning)
		if len(live) > 0 {
			q = q.Where("id NOT IN (?)", bun.In(live))
		}
		if _, err := q.Exec(ctx); err != nil {
			return err
		}
		p.startFleet()
		return nil
	}
	var rows []store.Intern
	if err := p.DB.NewSelect().Model(&rows).Where("state IN (?)", bun.In([]string{store.InternProvisioning, store.InternRunning})).Scan(ctx); err != nil {
		return err
	}
	for i := range rows {
		p.Changed(ctx, &rows[i])
	}
	return nil
}

// startFleet runs the reconciler unless the provisioner is closed.
func (p *Provisioner) startFleet() {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if !closed {
		p.runFleet()
	}
}

// Changed follows an intern's record: it is the interns.Lifecycle hook.
// It never blocks on a daemon: starting and stopping happen in the
// background, and the record's state says when the intern is running.
func (p *Provisioner) Changed(ctx context.Context, in *store.Intern) {
	p.init()
	switch p.Mode {
	case Remote:
		if in.State == store.InternProvisioning && in.DaemonURL != "" {
			// A resumed remote intern runs again once its daemon answers.
			go p.markRunningWhenHealthy(in.ID)
		}
	default:
		// The reconciler reads the row again: the database is the truth.
		p.nudge()
	}
}

// markRunningWhenHealthy checks a registered remote daemon once.
func (p *Provisioner) markRunningWhenHealthy(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), p.HealthTimeout)
	defer cancel()
	var in store.Intern
	if err := p.DB.NewSelect().Model(&in).Where("id = ?", id).Scan(ctx); err != nil {
		return
	}
	secret, err := p.unwrap(&in)
	if err != nil {
		p.Log.Error("daemon secret does not open", "intern", id, "err", err)
		return
	}
	if _, err := p.dial("", in.DaemonURL, secret).Status(ctx, connect.NewRequest(&pb.StatusRequest{})); err != nil {
		p.Log.Warn("remote daemon not healthy", "intern", id, "err", err)
		return
	}
	if err := p.setRunning(ctx, id); err != nil {
		p.Log.Error("mark intern running", "intern", id, "err", err)
	}
}

// setRunning moves an intern from provisioning to running, and only from
// there: a suspend that raced the start wins.
func (p *Provisioner) setRunning(ctx context.Context, id string) error {
	_, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("state = ?", store.InternRunning).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state = ?", id, store.InternProvisioning).Exec(ctx)
	return err
}

// Register records a remote daemon's URL and secret for an intern, after
// checking that the daemon answers with that secret, and marks a
// provisioning intern running. The secret is stored wrapped by the KEK.
func (p *Provisioner) Register(ctx context.Context, internID, daemonURL, secret string) (*store.Intern, error) {
	p.init()
	u, err := url.Parse(daemonURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, apierr.BadRequest("the daemon URL must be http:// or https:// with a host")
	}
	secret = strings.TrimSpace(secret)
	if secret == "" {
		return nil, apierr.BadRequest("the daemon secret is empty")
	}
	var in store.Intern
	if err := p.DB.NewSelect().Model(&in).Where("id = ? AND state <> ?", internID, store.InternDeleted).Scan(ctx); err != nil {
		return nil, apierr.NotFound("intern %q not found", internID)
	}
	hctx, cancel := context.WithTimeout(ctx, p.HealthTimeout)
	defer cancel()
	if _, err := p.dial("", daemonURL, secret).Status(hctx, connect.NewRequest(&pb.StatusRequest{})); err != nil {
		return nil, apierr.New(http.StatusBadGateway, "intern_unreachable", "the daemon did not answer Status with this secret: %s", connect.CodeOf(err))
	}
	wrapped, err := p.wrap(internID, secret)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	in.DaemonURL, in.DaemonSecret, in.Provisioner = strings.TrimRight(daemonURL, "/"), wrapped, Remote
	if _, err := p.DB.NewUpdate().Model(&in).Column("daemon_url", "daemon_secret", "provisioner").WherePK().Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	if err := p.setRunning(ctx, internID); err != nil {
		return nil, apierr.Internal(err)
	}
	if err := p.DB.NewSelect().Model(&in).WherePK().Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return &in, nil
}

// Close stops every local daemon, all at once (their runs end with them),
// or, when jails outlive their gateway (JailConfig.Orphan), lets go of
// them for the next gateway to adopt.
func (p *Provisioner) Close() {
	p.init()
	p.mu.Lock()
	p.closed = true
	p.leaving = p.Jail != nil && p.Jail.Orphan > 0
	if p.leaving && len(p.sups) > 0 {
		p.Log.Info("interns' jails left running for the next gateway", "interns", len(p.sups), "stop_without_one_after", p.Jail.Orphan.String())
	}
	sups := make([]*supervisor, 0, len(p.sups))
	for _, s := range p.sups {
		sups = append(sups, s)
	}
	p.sups = map[string]*supervisor{}
	p.mu.Unlock()
	if p.fleet.stop != nil {
		p.fleet.stop()
		p.fleet.done.Wait()
	}
	var wg sync.WaitGroup
	for _, s := range sups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.stop()
		}()
	}
	wg.Wait()
	if p.Jail != nil && !p.leaving {
		// Jails a previous gateway left that this one had not attached
		// yet (a stop right after a start) would otherwise run on for the
		// previous gateway's orphan timeout.
		p.stopJails(p.aliveJails(), "the gateway stops, and its jails with it")
	}
}

// VerifyDaemonSecret reports whether presented is the daemon's credential
// for the gateway (internd.DaemonCredential), derived from the daemon
// secret stored (wrapped by the KEK) on the intern's row. The intern's
// daemon presents it to the gateway's InternGatewayService; the secret
// itself, or what the gateway presents to the daemon, is refused. Both
// sides are hashed first, so the comparison is constant-time whatever the
// lengths.
func VerifyDaemonSecret(kek *envelope.KEK, in *store.Intern, presented string) bool {
	if in.DaemonSecret == "" || presented == "" {
		return false
	}
	stored, err := (&Provisioner{KEK: kek}).unwrap(in)
	if err != nil {
		return false
	}
	a, b := sha256.Sum256([]byte(internd.DaemonCredential(stored))), sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}
