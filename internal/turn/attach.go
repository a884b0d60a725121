package turn

import (
	"context"
	"io"
	"net/http"
	"time"

	"connectrpc.com/connect"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/lookahead"
	"github.com/cohort-dev/cohort/internal/store"
)

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
	client, err := s.Daemons.ClientFor(in)
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
	client, err := s.Daemons.ClientFor(in)
	if err != nil {
		return false, daemonError(err)
	}
	res, err := client.Cancel(ctx, connect.NewRequest(&interndv1.CancelRequest{SessionId: sessionID}))
	if err != nil {
		return false, daemonError(err)
	}
	return res.Msg.GetCancelled(), nil
}
