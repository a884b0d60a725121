// Package provision runs the fleet of interns: one reconciler
// (Provisioner) starts, wakes, puts to sleep, evicts and restarts their
// daemons (`cohort intern`) as the database says, through one Backend
// that hosts them, and gives the chat gateway an authenticated client for
// an intern's daemon.
//
// Three backends exist, each its own package: localjail (the default: one
// jail per awake intern on this machine, or a plain child with
// --unsafe-shared-host), kubepods (one Pod per awake intern, its files on
// a claim) and remote (daemons the operator runs and registers with
// `cohort admin intern register`). docs/architecture.md draws the seam.
//
// Whichever hosts it, a daemon's URL and its secret (wrapped by the KEK)
// are in the intern's row, so any gateway replica can reach any daemon.
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
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/h2coalesce"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/lookahead"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

// Dialer is what the chat gateway needs: an authenticated client for an
// intern's daemon. *Provisioner implements it.
type Dialer interface {
	Client(ctx context.Context, intern *store.Intern) (interndv1connect.InternDaemonServiceClient, error)
}

// Provisioner is the fleet's reconciler: it implements interns.Lifecycle
// and Dialer over one Backend, which it drives without knowing which.
type Provisioner struct {
	DB  *bun.DB
	KEK *envelope.KEK
	Log *slog.Logger
	// Backend hosts the daemons (the wiring picks it).
	Backend Backend
	// HealthTimeout bounds the wait for a started daemon to answer
	// (default 30 s).
	HealthTimeout time.Duration
	// RestartBackoff is the first delay before starting a daemon again
	// after it died or failed to start (default 1 s, doubling up to 30 s).
	RestartBackoff time.Duration
	// IdleTimeout puts an intern to sleep after this long without a call
	// to its daemon, a live or paused run or an open stream (0: never).
	IdleTimeout time.Duration
	// MaxAwake caps the awake interns (0: no cap): at the cap the least
	// recently used idle one sleeps to admit another.
	MaxAwake int
	// StartConcurrency bounds daemons starting at once (default 4).
	StartConcurrency int
	// Sweep is how often the reconciler reads the database even without a
	// change notification (default 1 s).
	Sweep time.Duration
	// WakeTimeout bounds a wake, however long the backend or another
	// replica takes (default 2 m).
	WakeTimeout time.Duration
	// OnWake, when set, is told of every wake of a sleeping intern: how
	// long it took and whether it worked (internal/metrics).
	OnWake func(took time.Duration, ok bool)

	fleet    fleet
	fleetCtx context.Context

	once   sync.Once
	client *http.Client
	// routes maps a daemon address to the unix socket it forwards to
	// (Host.Route): the client dials the socket.
	routes sync.Map

	// dialed caches the Connect client of each (intern, URL, wrapped
	// secret) seen: building one and unwrapping the secret cost more than
	// the rest of a turn's set-up. The key is the row as read from the
	// database on each request, so a changed URL or rotated secret misses;
	// no state is cached, only what a given row dials.
	dialMu sync.Mutex
	dialed map[dialKey]interndv1connect.InternDaemonServiceClient
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
		if p.WakeTimeout <= 0 {
			p.WakeTimeout = 2 * time.Minute
		}
		p.fleetCtx = context.Background()
		p.fleet.init(cmp.Or(max(p.StartConcurrency, 0), DefaultStartConcurrency))
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
			DialContext:         h2coalesce.Dialer(p.dialDaemon),
			MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second})}}
	})
}

// dialDaemon dials a daemon: its address, or the unix socket a backend routed
// it to (Host.Route).
func (p *Provisioner) dialDaemon(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if path, ok := p.routes.Load(addr); ok {
		return d.DialContext(ctx, "unix", path.(string))
	}
	return d.DialContext(ctx, network, addr)
}

// route is Host.Route.
func (p *Provisioner) route(addr, path string) func() {
	p.routes.Store(addr, path)
	return func() { p.routes.CompareAndDelete(addr, path) }
}

// secretAD binds a wrapped daemon secret to its intern: a row's ciphertext
// copied onto another intern does not open.
func secretAD(internID string) []byte { return []byte("cohort/intern-daemon-secret/" + internID) }

// NewSecret returns 32 random bytes, base64url.
func NewSecret() string {
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
		return nil, apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the intern could not be reached").WithCause(err)
	}
	return p.ClientFor(&in)
}

// ClientFor is Client for a row the caller read from the database in this
// same request (the chat orchestration's interns.Load): it applies the
// same checks without reading the row a second time.
func (p *Provisioner) ClientFor(in *store.Intern) (interndv1connect.InternDaemonServiceClient, error) {
	p.init()
	if in.State != store.InternRunning {
		return nil, apierr.Conflict(apierr.ReasonInternNotReady, "the intern is not running")
	}
	if in.DaemonURL == "" || in.DaemonSecret == "" {
		return nil, apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the intern could not be reached")
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
		return nil, apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the intern could not be reached").WithCause(err)
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
// captured it, it opens nothing (launch.GatewayCredential).
func (p *Provisioner) dial(id, base, secret string) interndv1connect.InternDaemonServiceClient {
	ics := []connect.Interceptor{bearerInterceptor("Bearer " + launch.GatewayCredential(secret))}
	if id != "" {
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

// Start opens the backend and starts the reconciler, as the gateway comes
// up. Daemons a previous gateway left running (jails that outlive it,
// Pods) are adopted as they are by the reconciler's first passes: their
// runs go on. An intern whose row says running but whose daemon the
// backend does not see died with that gateway: with sleep enabled it
// sleeps (the next turn wakes it); otherwise it starts again and is
// provisioning (chat waits for it), never running at a dead address.
func (p *Provisioner) Start(ctx context.Context) error {
	p.init()
	if p.fleet.closed() {
		return nil
	}
	fctx := p.fleet.begin()
	p.fleetCtx = fctx
	if err := p.Backend.Open(fctx, Host{Log: p.Log, Changed: p.nudge, Check: p.Healthy, Route: p.route}); err != nil {
		return err
	}
	if obs, complete := p.Backend.Observe(); complete {
		var live []string
		for _, o := range obs {
			if o.Running {
				live = append(live, o.ID)
			}
		}
		to := store.InternProvisioning
		if p.IdleTimeout > 0 {
			to = store.InternSleeping
		}
		q := p.DB.NewUpdate().Model((*store.Intern)(nil)).
			Set("state = ?", to).Set("updated_at = ?", store.Now(nil)).
			Where("state = ?", store.InternRunning)
		if len(live) > 0 {
			q = q.Where("id NOT IN (?)", bun.List(live))
		}
		if _, err := q.Exec(ctx); err != nil {
			return err
		}
	}
	p.runFleet(fctx)
	return nil
}

// Changed follows an intern's record: it is the interns.Lifecycle hook.
// It never blocks on a daemon: the reconciler reads the row again (the
// database is the truth) and acts in the background; the record's state
// says when the intern is running.
func (p *Provisioner) Changed(ctx context.Context, in *store.Intern) {
	p.init()
	p.nudge()
}

// setRunning moves an intern from provisioning to running, and only from
// there: a suspend that raced the start wins.
func (p *Provisioner) setRunning(ctx context.Context, id string) error {
	_, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("state = ?", store.InternRunning).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state = ?", id, store.InternProvisioning).Exec(ctx)
	return err
}

// Healthy checks once that the daemon at base answers Status with secret.
func (p *Provisioner) Healthy(ctx context.Context, base, secret string) error {
	p.init()
	_, err := p.dial("", base, secret).Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
	return err
}

// Record stores a daemon that backend (its Name) hosts for the intern: its
// URL and its secret, wrapped by the KEK; a provisioning intern runs.
func (p *Provisioner) Record(ctx context.Context, internID, daemonURL, secret, backend string) error {
	p.init()
	wrapped, err := p.wrap(internID, secret)
	if err != nil {
		return err
	}
	if _, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("daemon_url = ?", daemonURL).Set("daemon_secret = ?", wrapped).Set("provisioner = ?", backend).
		Where("id = ?", internID).Exec(ctx); err != nil {
		return err
	}
	return p.setRunning(ctx, internID)
}

// Secret returns the daemon secret the intern's row records (unwrapped),
// with the row, for a backend's own checks (a Pod's model relay token).
func (p *Provisioner) Secret(ctx context.Context, id string) (*store.Intern, string, error) {
	p.init()
	in, err := p.row(ctx, id)
	if err != nil {
		return nil, "", err
	}
	if in.DaemonSecret == "" {
		return in, "", errors.New("no daemon secret")
	}
	secret, err := p.unwrap(in)
	return in, secret, err
}

// Close stops the reconciler and lets go of the backend's daemons (the
// backend stops them or leaves them for the next gateway).
func (p *Provisioner) Close() {
	p.init()
	if p.fleet.end() && p.Backend != nil {
		p.Backend.Close()
	}
}

// VerifyDaemonSecret reports whether presented is the daemon's credential
// for the gateway (launch.DaemonCredential), derived from the daemon
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
	a, b := sha256.Sum256([]byte(launch.DaemonCredential(stored))), sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}
