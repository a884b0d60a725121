// Package chat is the two chat doors, Connect and REST (OpenAI
// compatible): they admit the caller, decode the request and hand it to
// internal/turn, which opens the turn on the intern's daemon and turns its
// events into chunks; the Connect door sends the chunks as they are, the
// REST door hands them to internal/sse. A request with "background": true
// (or the answer to a paused background run) goes to internal/runs
// instead, which reads the same turn stream (ADR 0971).
package chat

import (
	"context"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/runs"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/turn"
)

// Service is what the chat doors share: the interns' rows and the turns,
// whose settings (daemons, limiter, budgets, observer) are those of the
// background runs too.
type Service struct {
	Interns *interns.Service
	*turn.Service
}

// ErrDeparted is the 403 (without a reason) for a key whose creator left the
// organization and holds no grant.
var ErrDeparted = interns.ErrDeparted

// Admit runs the caller checks that come before the body is even read:
// authentication happened, the interns programme (plain 404) and the
// departed creator (plain 403). Callers outside the programme must not learn
// anything about the route, not even that their body was malformed. It is
// the chat route's declared caller check (internal/server), run once per
// request on both doors; the doors open turns for a principal it admitted.
// A refusal is counted (Observer) as any other before the stream.
func (s *Service) Admit(p *auth.Principal) error {
	err := interns.CheckProgramme(p)
	if err == nil && p.Departed() {
		err = ErrDeparted
	}
	if err != nil && s.Observer != nil {
		s.Observer.Refused(string(apierr.From(err).Reason))
	}
	return err
}

// load reads the intern's row the request names, for a caller who
// presented no row read with the key (the Connect door).
func (s *Service) load(ctx context.Context, p *auth.Principal, req *cohortv1.StreamChatCompletionRequest) func() (*store.Intern, error) {
	return func() (*store.Intern, error) { return s.Interns.Load(ctx, p, req.GetInternId()) }
}

var errNoBackground = apierr.BadRequest("background runs are not enabled on this gateway")

// background reports whether req is to run in the background (with rs,
// nil when the gateway runs none): it asks to, or it answers a paused
// background run.
func background(ctx context.Context, rs *runs.Manager, req *cohortv1.StreamChatCompletionRequest) bool {
	if req.GetBackground() {
		return true
	}
	msgs := req.GetMessages()
	if rs == nil || req.SessionId == nil || len(msgs) == 0 || msgs[len(msgs)-1].GetRole() != "tool" {
		return false
	}
	return rs.Paused(ctx, req.GetInternId(), req.GetSessionId())
}

// startBackground answers a Connect request with background set: one
// message carrying the run.
func startBackground(ctx context.Context, rs *runs.Manager, p *auth.Principal, req *cohortv1.StreamChatCompletionRequest, load func() (*store.Intern, error), out *connect.ServerStream[cohortv1.StreamChatCompletionResponse]) error {
	if rs == nil {
		return errNoBackground
	}
	res, err := rs.Start(ctx, p, req, load)
	if err != nil {
		return err
	}
	return out.Send(&cohortv1.StreamChatCompletionResponse{Run: res.Run})
}
