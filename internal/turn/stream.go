package turn

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/lookahead"
)

// Wire constants of the chunks.
const (
	chunkObject = "chat.completion.chunk"
	roleAsst    = "assistant"
	toolName    = "service.provide_input"
	// drainTimeout bounds the wait for the daemon to close its stream after
	// the last event it must send.
	drainTimeout = 5 * time.Second
)

// Stream is one open response: it pulls daemon events and yields chunks.
// Next must be called from one goroutine; Close may be called from any.
type Stream struct {
	svc     *Service
	opened  bool            // counted as an open stream (Observer) until release
	ctx     context.Context // the caller's
	cancel  context.CancelFunc
	id      string
	created int64

	recv        func() (*interndv1.RunEvent, error)
	closeDaemon func() error
	// look shows what the daemon sent that recv has not read yet.
	look *lookahead.Body

	// timer ends a stream silent for longer than budget since the last
	// event. An event only stores its time in last (ns since base, the
	// monotonic clock); the timer, when it fires, re-arms itself for what
	// is left, so no event resets a timer (ADR 0975).
	timer    *time.Timer
	base     time.Time
	last     atomic.Int64
	budget   atomic.Int64
	stopped  atomic.Bool // the timers are stopped: expire must not re-arm
	timedOut atomic.Bool
	// turnTimer bounds the whole request's run (Service.TurnTimeout).
	turnTimer    *time.Timer
	turnTimedOut atomic.Bool
	// recorded is set once the run's ending went to the Observer.
	recorded atomic.Bool

	session  *string
	usage    *cohortv1.ChatUsage
	lastEv   *interndv1.RunEvent // the event translate saw last (NextEvent)
	roleSent bool
	queue    []*cohortv1.ChatCompletionChunk
	done     bool
	closed   bool
	gone     error // the caller's context error once the caller went away
	// After a Finished event the daemon's stream must be drained before
	// the chunks Finished produced go out (drain); the chunks queued
	// before it need not wait. undrained counts those earlier chunks.
	drainDue  bool
	undrained int
}

// ID is the completion id every chunk of the response carries.
func (s *Stream) ID() string { return s.id }

// arm (re)starts the budget after which the daemon call is cancelled and
// the stream ends with a timeout. Only the goroutine that reads the
// stream calls it.
func (s *Stream) arm(d time.Duration) {
	if s.timer == nil {
		s.base = time.Now()
	}
	// last before budget: expire reads them in the other order, so a
	// shorter budget is never paired with an older last event.
	s.touch()
	s.budget.Store(int64(d))
	if s.timer == nil {
		s.timer = time.AfterFunc(d, s.expire)
		return
	}
	s.timer.Reset(d)
}

// touch records that an event arrived now.
func (s *Stream) touch() { s.last.Store(int64(time.Since(s.base))) }

// expire runs when the timer fires: it ends the stream if nothing arrived
// for the budget, else waits for the rest of it.
func (s *Stream) expire() {
	budget := s.budget.Load()
	if left := time.Duration(s.last.Load() + budget - int64(time.Since(s.base))); left > 0 {
		s.timer.Reset(left)
		if s.stopped.Load() {
			s.timer.Stop() // stopTimers ran while this re-armed it
		}
		return
	}
	s.timedOut.Store(true)
	s.cancel()
}

// Close cancels the daemon call if it is still running. A caller that goes
// away mid-run thereby cancels the run; after the stream ended (including a
// pause) the daemon call is already complete and nothing changes.
func (s *Stream) Close() {
	if s.opened {
		// Every other ending was recorded before the door saw the end of
		// the stream: what is left is a caller who stopped reading.
		s.record("caller_gone", ErrClientClosed.Reason)
	}
	s.stopTimers()
	s.cancel()
}

func (s *Stream) stopTimers() {
	s.stopped.Store(true)
	if s.timer != nil {
		s.timer.Stop()
	}
	if s.turnTimer != nil {
		s.turnTimer.Stop()
	}
}

// record tells the Observer how the run ended, the first time only.
func (s *Stream) record(outcome string, reason apierr.Reason) {
	if s.recorded.CompareAndSwap(false, true) && s.svc.Observer != nil {
		s.svc.Observer.Finished(outcome, string(reason))
	}
}

// release ends the daemon call from the goroutine that reads it.
func (s *Stream) release() {
	if s.closed {
		return
	}
	s.closed = true
	if s.opened && s.svc.Observer != nil {
		s.svc.Observer.Closed()
	}
	s.stopTimers()
	if s.closeDaemon != nil {
		_ = s.closeDaemon()
	}
}

// refusal maps a failure before the first event.
func (s *Stream) refusal(err error) *apierr.Error {
	switch {
	case s.ctx.Err() != nil:
		return ErrClientClosed.WithCause(err)
	case s.timedOut.Load(), s.turnTimedOut.Load():
		return errTimeout.WithCause(err)
	default:
		return retryable(daemonError(err))
	}
}

// Next returns the next chunk, io.EOF after the final chunk, or the
// caller's context error when the caller went away (then no final chunk
// exists: there is nobody to deliver it to).
func (s *Stream) Next() (*cohortv1.ChatCompletionChunk, error) {
	for len(s.queue) == 0 {
		if s.gone != nil {
			return nil, s.gone
		}
		if s.done {
			s.release()
			return nil, io.EOF
		}
		s.pull()
	}
	if s.drainDue && s.undrained == 0 {
		s.drain()
	}
	if s.drainDue {
		s.undrained--
	}
	c := s.queue[0]
	s.queue[0] = nil
	if len(s.queue) == 1 {
		s.queue = s.queue[:0] // keep the array: one chunk an event needs no new one
	} else {
		s.queue = s.queue[1:]
	}
	return c, nil
}

// pull receives one daemon event, waiting for it, and queues its chunks.
func (s *Stream) pull() {
	ev, err := s.recv()
	if ev != nil {
		s.touch()
		s.translate(ev)
		return
	}
	if s.ctx.Err() != nil {
		s.record("caller_gone", ErrClientClosed.Reason)
		s.done = true
		s.gone = context.Cause(s.ctx)
		s.release()
		return
	}
	e := s.midStreamError(err)
	switch {
	case s.turnTimedOut.Load():
		s.record("turn_timeout", e.Reason)
	case s.timedOut.Load():
		s.record("event_timeout", e.Reason)
	default:
		s.record("error", e.Reason)
	}
	s.fail(e, ServiceModel)
}

// Ready reports whether Next has a chunk (or the end) without waiting for
// the daemon. Events that have already arrived whole count: they are
// received here, so a burst from the daemon leaves in one write.
func (s *Stream) Ready() bool {
	for len(s.queue) == 0 && !s.done && s.arrived(false) {
		s.pull()
	}
	if s.drainDue && s.undrained == 0 && len(s.queue) > 0 {
		if !s.arrived(true) {
			return false // the drain would wait for the daemon
		}
		s.drain()
	}
	return len(s.queue) > 0 || s.done
}

// arrived reports whether a whole daemon message has arrived and not been
// read, so receiving it cannot block: an event, or with end the
// end-of-stream message. A Connect envelope is a flags byte (2 marks the
// end of the stream) and a big-endian length.
func (s *Stream) arrived(end bool) bool {
	b := s.look.Buffered()
	if len(b) < 5 || (b[0]&2 != 0) != end {
		return false
	}
	return uint64(len(b)-5) >= uint64(binary.BigEndian.Uint32(b[1:5]))
}

// midStreamError is what the caller is told when the daemon stream stops
// without a Finished event.
func (s *Stream) midStreamError(err error) *apierr.Error {
	if s.turnTimedOut.Load() {
		return errTurnTimeout.WithCause(err)
	}
	if s.timedOut.Load() {
		return errSilent.WithCause(err)
	}
	if err == nil {
		return errSevered.WithCause(errors.New("daemon stream ended without a Finished event"))
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		// A refusal the daemon states with our detail is relayed as it is;
		// anything else is a broken connection.
		if e := daemonError(err); e.Reason != errUnreachable.Reason && e.Reason != errRejected.Reason && e.Reason != errTimeout.Reason {
			return e
		}
	}
	return errSevered.WithCause(err)
}

func modelOf(ev *interndv1.RunEvent) string {
	if m := ev.GetModel(); m != "" {
		return m
	}
	return ServiceModel
}

func (s *Stream) chunk(model string, choices ...*cohortv1.ChatChoice) *cohortv1.ChatCompletionChunk {
	return &cohortv1.ChatCompletionChunk{Id: s.id, Object: chunkObject, Created: s.created, Model: model, Choices: choices}
}

func (s *Stream) push(c *cohortv1.ChatCompletionChunk) { s.queue = append(s.queue, c) }

// role makes sure the role chunk comes first.
func (s *Stream) role(model string) {
	if s.roleSent {
		return
	}
	s.roleSent = true
	r := roleAsst
	s.push(s.chunk(model, &cohortv1.ChatChoice{Delta: &cohortv1.ChatDelta{Role: &r}}))
}

func (s *Stream) delta(model string, d *cohortv1.ChatDelta) {
	s.role(model)
	s.push(s.chunk(model, &cohortv1.ChatChoice{Delta: d}))
}

// textChunk is a one-choice chunk whose delta is text: its messages and
// the text in one allocation instead of five, one per model chunk
// (ADR 0975).
type textChunk struct {
	c       cohortv1.ChatCompletionChunk
	choice  cohortv1.ChatChoice
	d       cohortv1.ChatDelta
	choices [1]*cohortv1.ChatChoice
	text    string
}

// text queues a content (or reasoning) delta.
func (s *Stream) text(model, t string, reasoning bool) {
	s.role(model)
	x := &textChunk{text: t}
	if reasoning {
		x.d.Reasoning = &x.text
	} else {
		x.d.Content = &x.text
	}
	x.choice.Delta = &x.d
	x.choices[0] = &x.choice
	x.c.Id, x.c.Object, x.c.Created, x.c.Model, x.c.Choices = s.id, chunkObject, s.created, model, x.choices[:]
	s.push(&x.c)
}

func (s *Stream) finish(model, reason string) {
	s.role(model)
	s.push(s.chunk(model, &cohortv1.ChatChoice{FinishReason: &reason, Delta: &cohortv1.ChatDelta{}}))
}

// final queues the final chunk and ends the stream.
func (s *Stream) final(model string, usage *cohortv1.ChatUsage) {
	c := s.chunk(model)
	c.Choices = []*cohortv1.ChatChoice{}
	c.SessionId = s.session
	c.Usage = usage
	s.push(c)
	s.done = true
}

// fail queues an error chunk and the final chunk.
func (s *Stream) fail(e *apierr.Error, model string) {
	s.finish(model, "error")
	last := s.queue[len(s.queue)-1]
	last.Error = &cohortv1.ChunkError{Code: int32(e.Status), Message: e.Message, Reason: string(e.Reason)}
	s.final(model, s.usage)
}

// translate turns one daemon event into zero or more chunks.
func (s *Stream) translate(ev *interndv1.RunEvent) {
	s.lastEv = ev
	model := modelOf(ev)
	switch x := ev.GetEvent().(type) {
	case *interndv1.RunEvent_Started:
		if sid := x.Started.GetSessionId(); sid != "" {
			s.session = &sid
		}
		s.role(model)
	case *interndv1.RunEvent_Text:
		if t := x.Text.GetText(); t != "" {
			s.text(model, t, false)
		}
	case *interndv1.RunEvent_Reasoning:
		if t := x.Reasoning.GetText(); t != "" {
			s.text(model, t, true)
		}
	case *interndv1.RunEvent_Interaction:
		s.delta(model, &cohortv1.ChatDelta{ToolCalls: []*cohortv1.ToolCall{{
			Index: 0, Id: x.Interaction.GetId(), Type: "function",
			Function: &cohortv1.FunctionCall{Name: toolName, Arguments: arguments(x.Interaction)},
		}}})
	case *interndv1.RunEvent_Usage:
		u := x.Usage
		s.usage = &cohortv1.ChatUsage{PromptTokens: u.GetPromptTokens(), CompletionTokens: u.GetCompletionTokens(),
			TotalTokens: u.GetTotalTokens(), Cost: u.Cost, CachedTokens: u.CachedTokens}
	case *interndv1.RunEvent_Finished:
		// The chunks Finished makes go out once the daemon's stream has
		// closed (drain); the ones queued before it do not wait for that.
		s.drainDue, s.undrained = true, len(s.queue)
		f := x.Finished
		outcome := map[interndv1.Finished_Reason]string{interndv1.Finished_REASON_STOP: "stop",
			interndv1.Finished_REASON_PAUSED: "paused", interndv1.Finished_REASON_ENDED: "ended"}[f.GetReason()]
		if outcome == "" {
			outcome = "error"
		}
		s.record(outcome, apierr.Reason(f.GetErrorReason()))
		switch f.GetReason() {
		case interndv1.Finished_REASON_STOP:
			s.finish(model, "stop")
			s.final(model, s.usage)
		case interndv1.Finished_REASON_PAUSED:
			// Usage is always null after a tool_calls finish: the turn is
			// not over, and its usage is reported when it is.
			s.finish(model, "tool_calls")
			s.final(model, nil)
		case interndv1.Finished_REASON_ENDED:
			s.fail(finishedError(f), ServiceModel)
		default:
			s.fail(finishedError(f), model)
		}
	}
}

// drain waits for the daemon to close its stream after Finished, so that
// closing our side can never look like a caller leaving mid-run (which
// would cancel a paused run).
func (s *Stream) drain() {
	s.drainDue = false
	s.arm(drainTimeout)
	for {
		if ev, err := s.recv(); ev == nil || err != nil {
			return
		}
	}
}

// permissionArgs and elicitationArgs are the two shapes of the
// service.provide_input arguments, keys in the spec's order.
type permissionArgs struct {
	Kind      string   `json:"kind"`
	Operation *string  `json:"operation"`
	Options   []string `json:"options"`
	// Added after the spec's fields: the agent's title for the tool call
	// and what it would do (command, diff, URL), so the caller sees it.
	Title string `json:"title,omitempty"`
	Input string `json:"input,omitempty"`
}

type elicitationArgs struct {
	Kind    string      `json:"kind"`
	Message string      `json:"message"`
	Fields  []fieldJSON `json:"fields"`
}

type fieldJSON struct {
	Name     string   `json:"name"`
	Type     string   `json:"type"`
	Required bool     `json:"required"`
	Options  []string `json:"options,omitempty"`
}

// arguments renders an interaction as the tool call's arguments string.
func arguments(in *interndv1.Interaction) string {
	var v any
	switch k := in.GetKind().(type) {
	case *interndv1.Interaction_Permission:
		opts := k.Permission.GetOptions()
		if opts == nil {
			opts = []string{}
		}
		v = permissionArgs{Kind: "permission", Operation: k.Permission.Operation, Options: opts,
			Title: k.Permission.GetTitle(), Input: k.Permission.GetInput()}
	case *interndv1.Interaction_Question:
		fields := make([]fieldJSON, 0, len(k.Question.GetFields()))
		for _, f := range k.Question.GetFields() {
			fields = append(fields, fieldJSON{Name: f.GetName(), Type: f.GetType(), Required: f.GetRequired(), Options: f.GetOptions()})
		}
		v = elicitationArgs{Kind: "elicitation", Message: k.Question.GetMessage(), Fields: fields}
	default:
		v = elicitationArgs{Kind: "elicitation", Fields: []fieldJSON{}}
	}
	b, _ := json.Marshal(v)
	return string(b)
}
