package internd

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

type runState int

const (
	stateStreaming runState = iota
	statePaused
	stateDone
)

// run is one prompt's turn. Its fields after mu are guarded by mu.
type run struct {
	d      *Daemon
	id     string
	sess   *session
	mode   pb.ApprovalMode
	prompt string
	caller string // who started it (StartTurnRequest.caller)
	// expiry forgets an ended run's events after FinishedRunTTL; stopped
	// when its session leaves memory first, so nothing holds the run.
	expiry *time.Timer
	// ctx governs the agent's session/prompt call; abort abandons it when
	// the agent does not confirm a cancellation in time.
	ctx   context.Context
	abort context.CancelFunc

	mu sync.Mutex
	// consumed is signalled when the attached consumer moves on, detaches,
	// or the run is cancelled: an agent that outpaces its consumer waits.
	consumed *sync.Cond
	log      eventLog
	state    runState
	attached bool
	// detached: a consumer that goes away does not cancel the run (a
	// background run, StartTurnRequest.detached).
	detached   bool
	pending    *interaction
	cancelling bool
	end        *apierr.Error // how a cancelled run ends; nil is run_ended
	model      string        // last model the agent reported in this run
	reply      strings.Builder
}

// interaction is a question the run waits on.
type interaction struct {
	id       string
	question bool
	// For a permission: offered kinds in the agent's order and the agent's
	// option id for each kind.
	kinds    []string
	optionID map[string]acp.PermissionOptionId
	fields   []*pb.Field
	timer    *time.Timer
	// reply receives exactly one answer (buffered).
	reply chan reply
}

// reply is the answer delivered to the agent's waiting request.
type reply struct {
	cancel   bool
	optionID acp.PermissionOptionId
	decline  bool
	content  map[string]any
}

func (d *Daemon) newRun(caller context.Context, s *session, mode pb.ApprovalMode, prompt string) *run {
	// The run outlives the request that started it; only its trace goes on.
	ctx, cancel := context.WithCancel(trace.ContextWithSpanContext(context.Background(), trace.SpanContextFromContext(caller)))
	r := &run{d: d, id: uuid.NewString(), sess: s, mode: mode, prompt: prompt, ctx: ctx, abort: cancel,
		log: newEventLog(d.cfg.RetainEvents, d.cfg.RetainBytes)}
	r.consumed = sync.NewCond(&r.mu)
	return r
}

// waitConsumerLocked holds an agent update while the attached consumer is
// a full retention bound behind: flow control from the consumer back to
// the agent (whose stdout the daemon then stops reading), instead of
// dropping events a live consumer has not seen.
func (r *run) waitConsumerLocked() {
	for r.log.pin != 0 && r.log.next-r.log.pin >= uint64(r.log.maxEvents) && !r.cancelling && r.state == stateStreaming {
		r.consumed.Wait()
	}
}

// add appends an event. Callers hold r.mu, except add's own lock-taking
// wrapper below.
func (r *run) addLocked(ev *pb.RunEvent) uint64 { return r.log.add(r.id, ev) }

func (r *run) add(ev *pb.RunEvent) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addLocked(ev)
}

// modelLocked is the model to stamp on an event the agent caused without
// naming one: the last it reported in this run, else the session's
// current model id if the agent reported one.
func (r *run) modelLocked() string {
	if r.model != "" {
		return r.model
	}
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	return r.sess.model
}

func finished(reason pb.Finished_Reason, e *apierr.Error) *pb.RunEvent {
	f := &pb.Finished{Reason: reason}
	if e != nil {
		f.Code, f.ErrorReason, f.Message = int32(e.Status), string(e.Reason), e.Message
	}
	return &pb.RunEvent{Event: &pb.RunEvent_Finished{Finished: f}}
}

// runTurn sends the prompt to the agent and records how the turn ended.
func (d *Daemon) runTurn(a *agentProc, r *run, acpID, prompt string) {
	defer d.turns.Done()
	mode := "self-drive"
	if r.mode == pb.ApprovalMode_APPROVAL_MODE_MANUAL {
		mode = "manual"
	}
	ctx, span := telemetry.Tracer().Start(r.ctx, "agent turn", trace.WithAttributes(attribute.String("cohort.run_id", r.id)))
	meta := map[string]any{MetaApprovalMode: mode}
	telemetry.Inject(ctx, meta)
	resp, err := a.conn.Prompt(ctx, acp.PromptRequest{
		SessionId: acp.SessionId(acpID),
		Prompt:    []acp.ContentBlock{acp.TextBlock(prompt)},
		Meta:      meta,
	})
	span.End()
	r.abort()

	r.mu.Lock()
	var last *pb.RunEvent
	var usage *pb.RunEvent
	end := ""
	switch {
	case r.cancelling:
		e := r.end
		if e == nil {
			e = errRunEnded("the run was cancelled")
		}
		last, end = finished(pb.Finished_REASON_ENDED, e), string(e.Reason)
		if e.Status != http.StatusGone {
			last = finished(pb.Finished_REASON_ERROR, e)
		}
	case err != nil:
		d.log.Warn("agent prompt failed", "run", r.id, "err", err)
		e := d.promptError(err)
		last, end = finished(pb.Finished_REASON_ERROR, e), string(e.Reason)
	default:
		reason, e := mapStop(resp.StopReason)
		last, end = finished(reason, e), string(resp.StopReason)
		if reason == pb.Finished_REASON_STOP {
			last.Model = r.modelLocked()
			usage = usageEvent(resp)
			if usage != nil {
				usage.Model = last.Model
			}
		}
	}
	if ia := r.pending; ia != nil {
		// The agent gave up on its own question.
		ia.timer.Stop()
		r.pending = nil
		d.releasePause(r.caller)
	}
	wasPaused := r.state == statePaused
	reply := r.reply.String()
	r.mu.Unlock()

	// Free the session before the consumer can see the end, so it can
	// start the next turn at once.
	d.turnDone(r, reply, end)

	r.mu.Lock()
	if usage != nil {
		r.addLocked(usage)
	}
	r.addLocked(last)
	r.state = stateDone
	r.mu.Unlock()
	// An ended run's events are for a consumer that reconnects soon; after
	// a while only its outcome (for late answers) is kept.
	expiry := time.AfterFunc(d.cfg.FinishedRunTTL, func() {
		r.mu.Lock()
		r.log.forget()
		r.mu.Unlock()
	})
	r.mu.Lock()
	r.expiry = expiry
	r.mu.Unlock()
	if !wasPaused {
		d.live.Add(-1)
	}
}

// promptError turns a failed session/prompt into the stream's error. The
// built-in agent says why in the JSON-RPC error ({"reason": "timeout"} for
// an upstream that timed out); anything else is turn_failed.
func (d *Daemon) promptError(err error) *apierr.Error {
	var re *acp.RequestError
	if errors.As(err, &re) {
		msg := d.agentMessage(err)
		if data, ok := re.Data.(map[string]any); ok && data["reason"] == "timeout" {
			return apierr.New(http.StatusGatewayTimeout, apierr.ReasonTimeout, "the intern's model did not answer in time: %s", msg)
		}
		// The agent's own words, whatever the JSON-RPC code (issue 29):
		// "model gpt-9 is not available" is the caller's to fix.
		if msg == "" || msg == "Internal error" {
			return errTurnFailed("the agent failed the turn")
		}
		return errTurnFailed("the agent failed the turn: %s", msg)
	}
	return errTurnFailed("the agent failed the turn")
}

// mapStop maps an ACP stop reason to how the stream finishes
// (ADR 0007).
func mapStop(s acp.StopReason) (pb.Finished_Reason, *apierr.Error) {
	switch s {
	case acp.StopReasonEndTurn, acp.StopReasonMaxTokens, acp.StopReasonMaxTurnRequests:
		return pb.Finished_REASON_STOP, nil
	case acp.StopReasonCancelled:
		return pb.Finished_REASON_ENDED, errRunEnded("the intern cancelled the run")
	case acp.StopReasonRefusal:
		return pb.Finished_REASON_ERROR, errTurnFailed("the agent refused to continue the turn")
	default:
		return pb.Finished_REASON_ERROR, errTurnFailed("the agent ended the turn with an unknown stop reason")
	}
}

func usageEvent(resp acp.PromptResponse) *pb.RunEvent {
	if resp.Usage == nil {
		return nil
	}
	u := &pb.Usage{PromptTokens: int64(resp.Usage.InputTokens), CompletionTokens: int64(resp.Usage.OutputTokens),
		TotalTokens: int64(resp.Usage.TotalTokens)}
	if resp.Usage.CachedReadTokens != nil {
		c := int64(*resp.Usage.CachedReadTokens)
		u.CachedTokens = &c
	}
	if c, ok := resp.Meta[MetaCost].(float64); ok {
		u.Cost = &c
	}
	return &pb.RunEvent{Event: &pb.RunEvent_Usage{Usage: u}}
}

// cancelRun cancels a run: a pending question is answered cancelled, the
// agent is sent session/cancel, and if it does not confirm within the
// grace period its prompt is abandoned. The run then ends with end (nil:
// ENDED run_ended 410). It reports whether this call cancelled the run.
func (d *Daemon) cancelRun(r *run, end *apierr.Error) bool {
	r.mu.Lock()
	if r.state == stateDone || r.cancelling {
		r.mu.Unlock()
		return false
	}
	r.cancelling, r.end = true, end
	r.consumed.Broadcast()
	if ia := r.pending; ia != nil {
		ia.timer.Stop()
		r.pending = nil
		d.releasePause(r.caller)
		d.live.Add(1)
		r.state = stateStreaming
		ia.reply <- reply{cancel: true}
	}
	r.mu.Unlock()

	d.mu.Lock()
	a, acpID := d.agent, r.sess.rec.ACPSessionID
	d.mu.Unlock()
	if a != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := a.conn.Cancel(ctx, acp.CancelNotification{SessionId: acp.SessionId(acpID)}); err != nil {
			d.log.Debug("session/cancel not sent", "err", err)
		}
		cancel()
	}
	time.AfterFunc(d.cfg.CancelGrace, r.abort)
	return true
}

// ask pauses the run on an interaction and waits for its reply. ev is the
// Interaction event (its id and deadline are filled in here). It returns
// a cancelled reply when the run cannot pause or ends meanwhile.
func (r *run) ask(ctx context.Context, ia *interaction, ev *pb.Interaction) reply {
	d := r.d
	// Reserve a paused slot; past the intern's bound or its caller's the
	// run fails with busy 503.
	if err := d.reservePause(r.caller); err != nil {
		d.cancelRun(r, err.(*apierr.Error))
		return reply{cancel: true}
	}
	ia.id = newInteractionID()
	ia.reply = make(chan reply, 1)
	ev.Id = ia.id
	deadline := d.now().Add(d.cfg.InteractionDeadline)
	ev.Deadline = timestamppb.New(deadline)
	if err := d.store.update(r.sess.rec.ID, func(rec *sessionRecord) {
		rec.Asked = append(rec.Asked, ia.id)
		if n := len(rec.Asked) - maxAsked; n > 0 {
			rec.Asked = append([]string(nil), rec.Asked[n:]...)
		}
	}); err != nil {
		d.log.Warn("record the interaction", "session", r.sess.rec.ID, "err", err)
	}

	// Findable by its id before the caller can learn the id from the
	// events below: an answer sent the moment the pause is read must find
	// the run, not a 409. (An answer before the run pauses gets 409 from
	// run.answer, as for any interaction not pending.)
	d.mu.Lock()
	r.sess.byIA[ia.id] = r
	d.mu.Unlock()

	r.mu.Lock()
	if r.state != stateStreaming || r.cancelling {
		r.mu.Unlock()
		d.releasePause(r.caller)
		return reply{cancel: true}
	}
	r.pending = ia
	r.state = statePaused
	model := r.modelLocked()
	r.addLocked(&pb.RunEvent{Model: model, Event: &pb.RunEvent_Interaction{Interaction: ev}})
	r.addLocked(&pb.RunEvent{Model: model, Event: &pb.RunEvent_Finished{Finished: &pb.Finished{Reason: pb.Finished_REASON_PAUSED}}})
	ia.timer = time.AfterFunc(d.cfg.InteractionDeadline, func() { r.expire(ia) })
	r.mu.Unlock()
	d.live.Add(-1)

	select {
	case rep := <-ia.reply:
		return rep
	case <-ctx.Done():
		// The agent withdrew its request, or it went away.
		r.mu.Lock()
		if r.pending == ia {
			ia.timer.Stop()
			r.pending = nil
			r.state = stateStreaming
			d.releasePause(r.caller)
			d.live.Add(1)
		}
		r.mu.Unlock()
		select {
		case rep := <-ia.reply:
			return rep
		default:
			return reply{cancel: true}
		}
	}
}

// expire cancels the run when its question's deadline passes.
func (r *run) expire(ia *interaction) {
	r.mu.Lock()
	current := r.pending == ia
	r.mu.Unlock()
	if current {
		r.d.cancelRun(r, errRunEnded("the interaction deadline passed; the run was cancelled"))
	}
}

// answer validates and delivers an answer. Exactly one of concurrent
// answers wins: the others see the interaction no longer pending.
func (r *run) answer(iaID, text string, detached bool) (*run, uint64, error) {
	d := r.d
	r.mu.Lock()
	ia := r.pending
	if ia == nil || ia.id != iaID || r.state != statePaused {
		r.mu.Unlock()
		return nil, 0, apierr.Conflict(apierr.ReasonInteractionNotPending, "the question is no longer waiting")
	}
	rep, err := ia.parse(text)
	if err != nil {
		r.mu.Unlock()
		return nil, 0, err
	}
	if r.attached {
		r.mu.Unlock()
		return nil, 0, apierr.Conflict(apierr.ReasonAttachmentFailed, "another request is already attached to the run")
	}
	ia.timer.Stop()
	r.pending = nil
	r.state = stateStreaming
	r.detached = r.detached || detached
	d.releasePause(r.caller)
	d.live.Add(1)
	r.attached, r.log.pin = true, r.log.next
	seq := r.addLocked(&pb.RunEvent{Event: &pb.RunEvent_Started{Started: &pb.Started{SessionId: r.sess.rec.ID, RunId: r.id, Continuation: true}}})
	if rep.cancel {
		// A cancel answer ends the run (ADR 0007): the agent's
		// question is answered cancelled and the turn is cancelled.
		r.mu.Unlock()
		ia.reply <- rep
		d.cancelRun(r, errRunEnded("the caller cancelled the run"))
		return r, seq, nil
	}
	ia.reply <- rep
	r.mu.Unlock()
	return r, seq, nil
}

// stream sends the run's events from seq from through the next Finished
// event. The caller must have attached; stream detaches. A consumer that
// goes away while the run streams cancels it; a paused run stays alive.
func (r *run) stream(ctx context.Context, from uint64, send func(*pb.RunEvent) error) error {
	defer func() {
		r.mu.Lock()
		r.attached = false
		r.log.pin = 0
		r.log.trim()
		r.consumed.Broadcast()
		r.mu.Unlock()
	}()
	gone := func(err error) error {
		r.mu.Lock()
		streaming := r.state == stateStreaming && !r.detached
		r.mu.Unlock()
		if streaming {
			r.d.cancelRun(r, nil)
		}
		return err
	}
	var buf []*pb.RunEvent
	for {
		r.mu.Lock()
		evs, wake, err := r.log.since(from)
		r.log.pin = from
		r.log.fetched = from + uint64(len(evs))
		r.consumed.Broadcast()
		buf = append(buf[:0], evs...)
		r.mu.Unlock()
		if err != nil {
			return err
		}
		for _, ev := range buf {
			if err := send(ev); err != nil {
				return gone(err)
			}
			from = ev.Seq + 1
			if ev.GetFinished() != nil {
				return nil
			}
		}
		if len(buf) == 0 {
			select {
			case <-wake:
			case <-ctx.Done():
				return gone(ctx.Err())
			}
		}
	}
}
