// Package turn opens a turn on an intern's daemon and turns the daemon's
// run events into chat chunks: the stream both the chat doors
// (internal/chat) and background runs (internal/runs) read (ADR 0971). It
// checks the request, asks the daemon to start a turn or to take an
// answer, waits for the daemon's first event (or its refusal), and then
// relays the daemon's run events as typed chat chunks.
//
// The gateway keeps no run state: a paused run lives on the daemon, so any
// replica can take the reply that resumes it.
package turn

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"time"

	"connectrpc.com/connect"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/lookahead"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/store"
)

// Defaults of the Service's budgets.
const (
	// DefaultFirstEventTimeout is the request budget: how long the daemon
	// may take to relay the agent's first event (its own Started does not
	// count), or to refuse, before the caller gets 504 timeout.
	DefaultFirstEventTimeout = 30 * time.Second
	// DefaultEventTimeout is how long an open stream may stay without any
	// daemon event before the service ends it with a timeout error chunk.
	// It is long because an agent may run a slow tool without a word.
	DefaultEventTimeout = 10 * time.Minute
	// DefaultTurnTimeout bounds one chat request's run in all: past it the
	// stream ends with a timeout and the daemon call (so the run) is
	// cancelled.
	DefaultTurnTimeout = 30 * time.Minute
)

// ServiceModel is the chunk model of chunks whose event carries none.
const ServiceModel = "service/intern"

// Daemons is the access to interns' daemons; the provisioner implements
// it. It is the one interface the turns need of it (ADR 0971): no
// optional one is looked for by type assertion.
type Daemons interface {
	// ClientFor gives an authenticated client for the daemon of an
	// intern row read from the database in this same request (no second
	// read). An error that is not an *apierr.Error is reported to the
	// caller as 502 intern_unreachable.
	ClientFor(in *store.Intern) (interndv1connect.InternDaemonServiceClient, error)
	// Wake wakes a sleeping (or still provisioning) intern and returns
	// its row once it runs, or the refusal. A host that cannot wake its
	// interns returns the row as it is: the turn is then refused as
	// intern_not_ready.
	Wake(ctx context.Context, in *store.Intern) (*store.Intern, error)
}

// Observer is told what streams do: opened (with the wait for the
// intern's first event, which the first chunk follows at once), closed,
// refused before the stream (by reason), and how each run ended, once per
// request: outcome "stop", "paused", "ended" or "error" (with the error's
// reason), "refused" (with the refusal's reason), "first_event_timeout",
// "event_timeout", "turn_timeout" or "caller_gone".
type Observer interface {
	Opened(firstEvent time.Duration)
	Closed()
	Refused(reason string)
	Finished(outcome, reason string)
}

// DefaultTurnRate is the turn rate per user or organization when none is
// configured (ADR 0006): 60 turns a minute, in bursts of 60.
var DefaultTurnRate = ratelimit.PerMinute(60)

// Service opens turns on the interns' daemons. One serves both the chat
// doors and the background runs: the limits, budgets and measurements
// are the same for both.
type Service struct {
	Daemons Daemons
	// Limiter counts new turns per RateKey: ratelimit.Memory in one
	// process, ratelimit.Redis shared by replicas; nil allows every turn.
	Limiter ratelimit.Limiter
	// Log records limiter failures; nil discards them.
	Log *slog.Logger
	// Observer receives the chat's measurements (internal/metrics); nil
	// drops them.
	Observer Observer
	// FirstEventTimeout and EventTimeout override the defaults when > 0.
	FirstEventTimeout time.Duration
	EventTimeout      time.Duration
	TurnTimeout       time.Duration
	// Now and NewID make streams reproducible in tests; nil uses the clock
	// and random "chatcmpl-" ids.
	Now   func() time.Time
	NewID func() string
}

func (s *Service) turnTimeout() time.Duration {
	if s.TurnTimeout > 0 {
		return s.TurnTimeout
	}
	return DefaultTurnTimeout
}

func (s *Service) firstEventTimeout() time.Duration {
	if s.FirstEventTimeout > 0 {
		return s.FirstEventTimeout
	}
	return DefaultFirstEventTimeout
}

func (s *Service) eventTimeout() time.Duration {
	if s.EventTimeout > 0 {
		return s.EventTimeout
	}
	return DefaultEventTimeout
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Service) newID() string {
	if s.NewID != nil {
		return s.NewID()
	}
	var b [18]byte
	rand.Read(b[:])
	return "chatcmpl-" + base64.RawURLEncoding.EncodeToString(b[:])
}

// Caller names who asks, for the daemon's bound on one caller's paused
// runs: the user for a personal key (it acts as that user), else the key
// (a federation access token is the key it acts as).
func Caller(p *auth.Principal) string {
	if p.KeyKind == store.KeyPersonal && p.UserID != "" {
		return "user:" + p.UserID
	}
	return "key:" + p.KeyID
}

// RateKey is the limiter key of a principal: the user for a personal key
// (it acts as that user), else the organization the key acts for.
func RateKey(p *auth.Principal) string {
	if p.KeyKind == store.KeyPersonal && p.UserID != "" {
		return "user:" + p.UserID
	}
	return "org:" + p.OrganizationID
}

// Options are how a turn is opened.
type Options struct {
	// Detached: the daemon runs the turn detached (a broken stream does
	// not cancel it), and Open returns as soon as the daemon started the
	// run, with the stream's first chunk (the role chunk) queued: a
	// background run (internal/runs). ctx must then outlive the request:
	// the stream's daemon call lives as long as it.
	Detached bool
}

// Open checks the request of an admitted caller, reads the intern's row
// with load (after the request is found well formed: a malformed one is
// 400 whatever the intern), starts the turn (or delivers the answer) on
// the intern's daemon and waits for its first event. A refusal at any
// point before that event is returned as an *apierr.Error and nothing has
// been sent; otherwise the returned Stream yields the chunks, starting
// with the role chunk. The daemon call lives as long as ctx: when the
// caller goes away, the daemon sees its call cancelled.
func (s *Service) Open(ctx context.Context, p *auth.Principal, req *cohortv1.StreamChatCompletionRequest, load func() (*store.Intern, error), o Options) (_ *Stream, err error) {
	var st *Stream
	if s.Observer != nil {
		began := s.now()
		defer func() {
			if err != nil {
				reason := string(apierr.From(err).Reason)
				s.Observer.Refused(reason)
				outcome := "refused"
				switch {
				case ctx.Err() != nil:
					outcome = "caller_gone"
				case st != nil && st.timedOut.Load():
					outcome = "first_event_timeout"
				case st != nil && st.turnTimedOut.Load():
					outcome = "turn_timeout"
				}
				s.Observer.Finished(outcome, reason)
			} else {
				s.Observer.Opened(s.now().Sub(began))
			}
		}()
	}
	t, err := validate(req)
	if err != nil {
		return nil, err
	}
	if t.start != nil {
		t.start.Caller = Caller(p)
		t.start.Detached = o.Detached
	}
	if t.answer != nil {
		t.answer.Detached = o.Detached
	}
	in, err := load()
	if err != nil {
		return nil, err
	}
	wake := s.Daemons != nil && (in.State == store.InternSleeping || in.State == store.InternProvisioning)
	if in.State != store.InternRunning && !wake {
		return nil, apierr.Conflict(apierr.ReasonInternNotReady, "intern is %s, not running", in.State)
	}
	if t.answer == nil && s.Limiter != nil {
		ok, retry, err := s.Limiter.Allow(ctx, RateKey(p))
		if err != nil {
			// A limiter that failed (Redis down) does not take chat down
			// with it: the turn goes ahead, and the failure is logged.
			if s.Log != nil {
				s.Log.Error("turn rate limiter failed; allowing the turn", "err", err)
			}
			ok = true
		}
		if !ok {
			e := apierr.New(http.StatusTooManyRequests, apierr.ReasonRateLimited, "too many turns; retry later")
			e.RetryAfter = max(1, int(math.Ceil(retry.Seconds())))
			return nil, e
		}
	}
	if s.Daemons == nil {
		return nil, errUnreachable.WithCause(errors.New("no daemon provisioner configured"))
	}
	if wake {
		// The caller's stream starts once the intern is up: only later.
		if in, err = s.Daemons.Wake(ctx, in); err != nil {
			return nil, err
		}
		if in.State != store.InternRunning {
			return nil, apierr.Conflict(apierr.ReasonInternNotReady, "intern is %s, not running", in.State)
		}
	}

	dctx, cancel := context.WithCancel(ctx)
	st = &Stream{
		svc:     s,
		ctx:     ctx,
		cancel:  cancel,
		id:      s.newID(),
		created: s.now().Unix(),
		look:    &lookahead.Body{},
	}
	// Over a lookahead.Transport the daemon's stream is read through st.look.
	dctx = lookahead.With(dctx, st.look)
	// The request budget covers reaching the daemon, its answer and its
	// first event. When it passes, the daemon call is cancelled and the
	// caller gets 504 timeout.
	st.arm(s.firstEventTimeout())
	st.turnTimer = time.AfterFunc(s.turnTimeout(), func() {
		st.turnTimedOut.Store(true)
		st.cancel()
	})
	opened := false
	defer func() {
		if !opened {
			st.Close()
			st.release()
		}
	}()

	// The row was read from the database just now: no second read.
	client, err := s.Daemons.ClientFor(in)
	if err != nil {
		return nil, st.refusal(err)
	}
	if t.answer != nil {
		sid := t.sessionID
		st.session = &sid
		res, err := client.Answer(dctx, connect.NewRequest(t.answer))
		if err != nil {
			return nil, st.refusal(err)
		}
		st.recv, st.closeDaemon = receiver(res), res.Close
	} else {
		res, err := client.StartTurn(dctx, connect.NewRequest(t.start))
		if err != nil {
			return nil, st.refusal(err)
		}
		st.recv, st.closeDaemon = receiver(res), res.Close
	}
	ev, err := st.recv()
	if err != nil {
		return nil, st.refusal(err)
	}
	if ev == nil {
		return nil, apierr.New(http.StatusBadGateway, apierr.ReasonStreamSevered, "the intern's stream ended before the turn started")
	}
	// A run that fails before any output is a refusal: the caller still gets
	// a plain JSON error with the status the daemon gave.
	if f := ev.GetFinished(); f != nil && f.GetReason() == interndv1.Finished_REASON_ERROR {
		return nil, retryable(finishedError(f))
	}
	st.translate(ev)
	// The daemon's Started is its own bookkeeping, sent before the agent
	// does anything: the request budget runs on until the agent's first
	// event, so a stalled agent gets the caller a 504 rather than an open
	// stream that stays silent for the event timeout.
	// A background turn is under way once the daemon started it, and so is
	// a run that continues after an answer (Started.continuation): the
	// intern accepted the answer, and what it does next (an approved
	// command that runs for minutes) is the run's, bounded by keepalives,
	// the event timeout and the turn deadline, never by the request budget.
	for ev.GetStarted() != nil && !ev.GetStarted().GetContinuation() && !o.Detached {
		if ev, err = st.recv(); err != nil {
			return nil, st.refusal(err)
		}
		if ev == nil {
			return nil, apierr.New(http.StatusBadGateway, apierr.ReasonStreamSevered, "the intern's stream ended before the turn started")
		}
		st.translate(ev)
	}
	st.arm(s.eventTimeout())
	opened, st.opened = true, true
	return st, nil
}

// responseStream is what StartTurn and Answer streams have in common.
type responseStream[T any] interface {
	Receive() bool
	Msg() *T
	Err() error
}

type eventHolder interface{ GetEvent() *interndv1.RunEvent }

// receiver turns a daemon stream into a function returning the next event,
// (nil, nil) at a clean end, or the stream's error.
func receiver[T any, PT interface {
	*T
	eventHolder
}](res responseStream[T]) func() (*interndv1.RunEvent, error) {
	return func() (*interndv1.RunEvent, error) {
		for res.Receive() {
			if ev := PT(res.Msg()).GetEvent(); ev != nil {
				return ev, nil
			}
		}
		return nil, res.Err()
	}
}

var (
	errUnreachable = apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the intern could not be reached")
	errRejected    = apierr.New(http.StatusBadGateway, apierr.ReasonInternRejected, "the intern rejected the request")
	errTimeout     = apierr.New(http.StatusGatewayTimeout, apierr.ReasonTimeout, "the intern did not answer within the request budget")
	errSilent      = apierr.New(http.StatusGatewayTimeout, apierr.ReasonTimeout, "the intern sent nothing for longer than the stream allows")
	errTurnTimeout = apierr.New(http.StatusGatewayTimeout, apierr.ReasonTimeout, "the turn ran longer than the turn deadline allows; it was cancelled")
	errSevered     = apierr.New(http.StatusBadGateway, apierr.ReasonStreamSevered, "the connection to the intern broke before the run ended")
	// ErrClientClosed is what a caller who hung up is logged with (499):
	// the Connect door returns it when it can no longer send.
	ErrClientClosed = apierr.New(499, apierr.ReasonClientClosedRequest, "the caller closed the request")
)

// daemonError maps a failure of a daemon call to the caller's error. A
// Connect error carrying our ErrorDetail keeps the daemon's status and
// reason; a transport failure means the daemon could not be reached; any
// other refusal by the daemon is intern_rejected.
func daemonError(err error) *apierr.Error {
	var ae *apierr.Error
	if errors.As(err, &ae) {
		return ae
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return errUnreachable.WithCause(err)
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if _, ok := v.(*cohortv1.ErrorDetail); ok {
				ae := apierr.FromConnect(err)
				// The daemon refusing the gateway's own credentials is
				// not the caller's 401/403: their key was fine.
				if ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden || ae.Reason == "" {
					return errRejected.WithCause(err)
				}
				return ae
			}
		}
	}
	switch ce.Code() {
	case connect.CodeUnavailable, connect.CodeCanceled:
		return errUnreachable.WithCause(err)
	case connect.CodeDeadlineExceeded:
		return errTimeout.WithCause(err)
	default:
		return errRejected.WithCause(err)
	}
}

// retryable gives a refusal the caller may retry a Retry-After when the
// daemon sent none (an older daemon; a Finished event carries none).
func retryable(e *apierr.Error) *apierr.Error {
	if e.RetryAfter > 0 {
		return e
	}
	switch {
	case e.Status == http.StatusServiceUnavailable && e.Reason == apierr.ReasonBusy:
		return e.Retry(apierr.RetryPaused)
	case e.Status == http.StatusConflict && e.Reason == apierr.ReasonBusy:
		return e.Retry(apierr.RetryBusySession)
	case e.Status == http.StatusTooManyRequests:
		return e.Retry(1)
	}
	return e
}

// finishedError is the error a Finished{ERROR|ENDED} event stands for.
func finishedError(f *interndv1.Finished) *apierr.Error {
	code, reason, msg := int(f.GetCode()), apierr.Reason(f.GetErrorReason()), f.GetMessage()
	if f.GetReason() == interndv1.Finished_REASON_ENDED {
		// The daemon's protocol: an ended run is always reported as
		// run_ended 410, whatever the daemon put in code and reason.
		code, reason = http.StatusGone, apierr.ReasonRunEnded
		if msg == "" {
			msg = "the intern ended the run"
		}
	}
	if code == 0 {
		code = http.StatusBadGateway
	}
	if reason == "" {
		reason = apierr.ReasonTurnFailed
	}
	if msg == "" {
		msg = "the intern's turn failed"
	}
	return apierr.New(code, reason, "%s", msg)
}
