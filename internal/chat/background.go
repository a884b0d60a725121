package chat

import (
	"context"
	"io"
	"net/http"
	"time"

	"connectrpc.com/connect"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/lookahead"
	"github.com/cohort-dev/cohort/internal/rest"
	"github.com/cohort-dev/cohort/internal/store"
)

// Background starts background turns (docs/background.md); internal/runs
// implements it. Both doors hand it a request with "background": true.
type Background interface {
	// Start starts the run (or, for a tool message, continues the paused
	// one) with no caller attached and returns it once it is under way. A
	// refusal is an *apierr.Error, as for a streamed request.
	Start(ctx context.Context, p *auth.Principal, req *cohortv1.StreamChatCompletionRequest, pl *interns.Preloaded) (*BackgroundStart, error)
	// Paused reports whether a background run of the intern's session is
	// paused: a tool message to that session continues it in the
	// background, whatever its background flag says.
	Paused(ctx context.Context, internID, sessionID string) bool
}

// background reports whether req is to run in the background: it asks
// to, or it answers a paused background run.
func (s *Service) background(ctx context.Context, req *cohortv1.StreamChatCompletionRequest) bool {
	if req.GetBackground() {
		return true
	}
	msgs := req.GetMessages()
	if s.Background == nil || req.SessionId == nil || len(msgs) == 0 || msgs[len(msgs)-1].GetRole() != "tool" {
		return false
	}
	return s.Background.Paused(ctx, req.GetInternId(), req.GetSessionId())
}

// BackgroundStart is a started background run.
type BackgroundStart struct {
	Run *cohortv1.BackgroundRun
	// JSON is the run object as the REST door's GET run returns it: the
	// REST door's 202 body.
	JSON []byte
}

var errNoBackground = apierr.BadRequest("background runs are not enabled on this gateway")

type backgroundKey struct{}

func isBackground(ctx context.Context) bool {
	v, _ := ctx.Value(backgroundKey{}).(bool)
	return v
}

// OpenBackground is Open for a background turn on the intern row in: the
// daemon runs it detached (a broken stream does not cancel it), and it
// returns as soon as the daemon started the run, with the stream's first
// chunk (the role chunk) queued. ctx must outlive the request: the
// stream's daemon call lives as long as it. Read it with NextEvent.
func (s *Service) OpenBackground(ctx context.Context, p *auth.Principal, req *cohortv1.StreamChatCompletionRequest, in *store.Intern) (*Stream, error) {
	return s.open(context.WithValue(ctx, backgroundKey{}, true), p, req, func() (*store.Intern, error) { return in, nil })
}

// NextEvent returns the chunks of the next daemon event and that event (nil
// for chunks the service made itself: the error of a broken stream), io.EOF
// after the final chunk, or the context's error once ctx ended. It reads
// the same stream as Next; use one or the other.
func (s *Stream) NextEvent() (*interndv1.RunEvent, []*cohortv1.ChatCompletionChunk, error) {
	for len(s.queue) == 0 {
		if s.gone != nil {
			return nil, nil, s.gone
		}
		if s.done {
			s.release()
			return nil, nil, io.EOF
		}
		s.lastEv = nil
		s.pull()
	}
	if s.drainDue {
		s.drain()
	}
	q := s.queue
	s.queue = nil
	return s.lastEv, q, nil
}

// TimedOut reports whether the stream ended because a budget passed (the
// turn's, or the silence allowed between events): the daemon's detached
// run then goes on, and the caller should cancel it.
func (s *Stream) TimedOut() bool { return s.timedOut.Load() || s.turnTimedOut.Load() }

// Resume says where a background run's recording stopped.
type Resume struct {
	SessionID, DaemonRunID string
	// From is the first daemon event to read.
	From uint64
	// ID and Created are those of the response being recorded.
	ID      string
	Created int64
	// RoleSent: that response's role chunk is recorded.
	RoleSent bool
	// Usage is the usage the daemon reported, if it did.
	Usage *cohortv1.ChatUsage
}

// Reattach attaches to a background run on the intern's daemon from
// at.From and returns the stream of its remaining chunks, the first
// event received: the chunks are those the interrupted stream would have
// made. A refusal (the daemon's attachment_failed 409 while the former
// reader is still attached; 410 when the events are gone) is returned as
// an *apierr.Error.
func (s *Service) Reattach(ctx context.Context, in *store.Intern, at Resume) (*Stream, error) {
	if s.Daemons == nil {
		return nil, errUnreachable
	}
	dctx, cancel := context.WithCancel(ctx)
	sid := at.SessionID
	st := &Stream{svc: s, ctx: ctx, cancel: cancel, id: at.ID, created: at.Created, look: &lookahead.Body{},
		session: &sid, usage: at.Usage, roleSent: at.RoleSent}
	dctx = lookahead.With(dctx, st.look)
	st.arm(s.eventTimeout())
	st.turnTimer = time.AfterFunc(s.turnTimeout(), func() {
		st.turnTimedOut.Store(true)
		st.cancel()
	})
	ok := false
	defer func() {
		if !ok {
			st.Close()
			st.release()
		}
	}()
	var client interndv1connect.InternDaemonServiceClient
	var err error
	if f, isRow := s.Daemons.(RowDaemons); isRow {
		client, err = f.ClientFor(in)
	} else {
		client, err = s.Daemons.Client(dctx, in)
	}
	if err != nil {
		return nil, daemonError(err)
	}
	res, err := client.Attach(dctx, connect.NewRequest(&interndv1.AttachRequest{SessionId: at.SessionID, RunId: at.DaemonRunID, FromSeq: at.From}))
	if err != nil {
		return nil, daemonError(err)
	}
	st.recv, st.closeDaemon = receiver(res), res.Close
	ev, err := st.recv()
	if err != nil {
		return nil, daemonError(err)
	}
	if ev == nil {
		return nil, apierr.New(http.StatusBadGateway, apierr.ReasonStreamSevered, "the intern's stream ended before it sent an event")
	}
	st.translate(ev)
	ok = true
	return st, nil
}

// Cancel asks the intern's daemon to cancel the session's current run
// (a background run: its stream does not cancel it).
func (s *Service) Cancel(ctx context.Context, in *store.Intern, sessionID string) (bool, error) {
	if s.Daemons == nil {
		return false, errUnreachable
	}
	var client interndv1connect.InternDaemonServiceClient
	var err error
	if f, isRow := s.Daemons.(RowDaemons); isRow {
		client, err = f.ClientFor(in)
	} else {
		client, err = s.Daemons.Client(ctx, in)
	}
	if err != nil {
		return false, daemonError(err)
	}
	res, err := client.Cancel(ctx, connect.NewRequest(&interndv1.CancelRequest{SessionId: sessionID}))
	if err != nil {
		return false, daemonError(err)
	}
	return res.Msg.GetCancelled(), nil
}

// background answers a REST request with "background": true: 202 and
// the run object.
func (h REST) background(w http.ResponseWriter, r *http.Request, p *auth.Principal, req *cohortv1.StreamChatCompletionRequest) {
	if h.S.Background == nil {
		rest.WriteError(w, r, errNoBackground, true)
		return
	}
	var pl *interns.Preloaded
	if v, ok := r.Context().Value(preloadedKey{}).(interns.Preloaded); ok {
		pl = &v
	}
	res, err := h.S.Background.Start(r.Context(), p, req, pl)
	if err != nil {
		rest.WriteError(w, r, err, true)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	w.Write(append(res.JSON, '\n'))
}

// startBackground answers a Connect request with background set: one
// message carrying the run.
func (s *Service) startBackground(ctx context.Context, p *auth.Principal, req *cohortv1.StreamChatCompletionRequest, out *connect.ServerStream[cohortv1.StreamChatCompletionResponse]) error {
	if s.Background == nil {
		return errNoBackground
	}
	res, err := s.Background.Start(ctx, p, req, nil)
	if err != nil {
		return err
	}
	return out.Send(&cohortv1.StreamChatCompletionResponse{Run: res.Run})
}
