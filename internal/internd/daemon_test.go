package internd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

const (
	manual    = pb.ApprovalMode_APPROVAL_MODE_MANUAL
	selfDrive = pb.ApprovalMode_APPROVAL_MODE_SELF_DRIVE
)

func TestUnauthenticatedCallsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// The secret itself, and the daemon's own credential for the gateway,
	// open nothing here: only the gateway's credential does.
	for _, tok := range []string{"", "wrong", secret + "x", strings.ToUpper(secret), secret, launch.DaemonCredential(secret),
		launch.GatewayCredential(secret) + "x"} {
		c := newClient(e.srv.URL, tok)
		_, err := c.Status(context.Background(), connect.NewRequest(&pb.StatusRequest{}))
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("Status with %q: want unauthenticated, got %v", tok, err)
		}
		s, err := c.StartTurn(context.Background(), connect.NewRequest(&pb.StartTurnRequest{Prompt: "hello"}))
		if err == nil {
			_, err = drain[pb.StartTurnResponse](s)
		}
		wantErr(t, err, 401, "")
		if strings.Contains(err.Error(), secret) {
			t.Fatal("error mentions the secret")
		}
	}
	if st := e.status(t); st.GetSessions() != 0 {
		t.Fatalf("refused calls created sessions: %v", st)
	}
}

func TestTurnCompletes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "", "hello", selfDrive)
	mustOK(t, err)
	checkSeqs(t, evs)
	st := started(t, evs)
	if _, err := uuid.Parse(st.GetSessionId()); err != nil {
		t.Fatalf("empty session id should get a UUID, got %q", st.GetSessionId())
	}
	if st.GetRunId() == "" {
		t.Fatalf("Started without a run id: %v", evs[0])
	}
	wantStarted := &pb.RunEvent{Seq: 1, RunId: st.GetRunId(),
		Event: &pb.RunEvent_Started{Started: &pb.Started{SessionId: st.GetSessionId(), RunId: st.GetRunId()}}}
	if d := cmp.Diff(wantStarted, evs[0], protocmp.Transform()); d != "" {
		t.Fatalf("Started event (-want +got):\n%s", d)
	}
	var kinds []string
	for _, ev := range evs {
		switch {
		case ev.GetReasoning() != nil:
			kinds = append(kinds, "reasoning:"+ev.GetReasoning().GetText()+"@"+ev.GetModel())
		case ev.GetText() != nil:
			kinds = append(kinds, "text:"+ev.GetText().GetText()+"@"+ev.GetModel())
		case ev.GetUsage() != nil:
			kinds = append(kinds, "usage@"+ev.GetModel())
		case ev.GetFinished() != nil:
			kinds = append(kinds, "finished:"+ev.GetFinished().GetReason().String())
		}
	}
	want := "reasoning:thinking@test/model-a text:Hello@test/model-a text:, world@test/model-b usage@test/model-b finished:REASON_STOP"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	wantUsage := &pb.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15, CachedTokens: proto.Int64(2), Cost: proto.Float64(0.25)}
	if d := cmp.Diff(wantUsage, evs[len(evs)-2].GetUsage(), protocmp.Transform()); d != "" {
		t.Fatalf("usage (-want +got):\n%s", d)
	}
	for _, ev := range evs {
		if ev.GetRunId() != st.GetRunId() {
			t.Fatalf("event of another run: %v", ev)
		}
	}
	// The same session id continues the session.
	evs, err = e.start(t, st.GetSessionId(), "whoami", selfDrive)
	mustOK(t, err)
	if started(t, evs).GetSessionId() != st.GetSessionId() {
		t.Fatal("session id changed")
	}
	if e.status(t).GetSessions() != 1 {
		t.Fatal("want one session")
	}
}

func TestModelFallsBackToSessionModel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "s", "nometa", selfDrive)
	mustOK(t, err)
	if evs[1].GetText().GetText() != "plain" || evs[1].GetModel() != "test/current" {
		t.Fatalf("want the session's current model on an event without one: %v", evs[1])
	}
	if u := evs[len(evs)-2]; u.GetUsage() != nil {
		t.Fatalf("no usage reported, none expected: %v", u)
	}
}

func TestApprovalModeReachesAgent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for mode, want := range map[pb.ApprovalMode]string{manual: "manual", selfDrive: "self-drive", pb.ApprovalMode_APPROVAL_MODE_UNSPECIFIED: "self-drive"} {
		evs, err := e.start(t, "s", "mode", mode)
		mustOK(t, err)
		if got := text(evs); got != want {
			t.Fatalf("mode %v: agent saw %q, want %q", mode, got, want)
		}
	}
}

func TestSelfDriveAnswersPermission(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "s", "perm", selfDrive)
	mustOK(t, err)
	if f := finish(t, evs); f.GetReason() != pb.Finished_REASON_STOP {
		t.Fatalf("want STOP, got %v", f)
	}
	if got := text(evs); got != "askingpermission: opt-ao" {
		t.Fatalf("self-drive should pick allow_once's own id: %q", got)
	}
	for _, ev := range evs {
		if ev.GetInteraction() != nil {
			t.Fatal("self-drive must not ask the caller")
		}
	}
}

func TestManualPermissionPausesAndContinues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "s", "perm", manual)
	mustOK(t, err)
	ia := interactionOf(t, evs)
	// The spec's fields as before, plus the title and the command (not its env).
	wantPermission := &pb.Permission{Operation: proto.String("shell"), Options: []string{"allow_once", "allow_always", "reject_once", "reject_always"},
		Title: "shell", Input: "ls -la /work"}
	if d := cmp.Diff(wantPermission, ia.GetPermission(), protocmp.Transform()); d != "" {
		t.Fatalf("permission (-want +got):\n%s", d)
	}
	if len(ia.GetId()) == 0 || len(ia.GetId()) > 128 || ia.GetDeadline().AsTime().Before(time.Now().Add(4*time.Minute)) {
		t.Fatalf("interaction id or default deadline: %v", ia)
	}
	if m := evs[len(evs)-2].GetModel(); m != "test/model-a" {
		t.Fatalf("interaction model %q", m)
	}
	// The text the agent sent before asking comes before the pause.
	if got := text(evs); got != "asking" {
		t.Fatalf("text before the pause: %q", got)
	}
	if st := e.status(t); st.GetPausedRuns() != 1 || st.GetLiveRuns() != 0 {
		t.Fatalf("status while paused: %v", st)
	}
	runID := started(t, evs).GetRunId()
	pausedAt := evs[len(evs)-1].GetSeq()

	evs, err = e.answer(t, "s", ia.GetId(), "reject_once")
	mustOK(t, err)
	checkSeqs(t, evs)
	st := started(t, evs)
	if !st.GetContinuation() || st.GetRunId() != runID || evs[0].GetSeq() != pausedAt+1 {
		t.Fatalf("continuation must resume the same run just after the pause: %v", evs[0])
	}
	if f := finish(t, evs); f.GetReason() != pb.Finished_REASON_STOP {
		t.Fatalf("want STOP, got %v", f)
	}
	if got := text(evs); got != "permission: opt-ro" {
		t.Fatalf("agent must receive its own option id: %q", got)
	}
	if st := e.status(t); st.GetPausedRuns() != 0 {
		t.Fatalf("status after: %v", st)
	}
	// The interaction of an ended run is no longer pending.
	_, err = e.answer(t, "s", ia.GetId(), "allow_once")
	wantErr(t, err, 409, "interaction_not_pending")
}

func TestAnswerContinuesUnderRunMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "s", "perm2", manual)
	mustOK(t, err)
	evs, err = e.answer(t, "s", interactionOf(t, evs).GetId(), "allow_always")
	mustOK(t, err)
	// Still manual: the second permission is asked too.
	evs, err = e.answer(t, "s", interactionOf(t, evs).GetId(), "reject_always")
	mustOK(t, err)
	if got := text(evs); got != "opt-aa opt-ra" {
		t.Fatalf("got %q", got)
	}
}

func TestPermissionAnswersRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "s", "perm", manual)
	mustOK(t, err)
	ia := interactionOf(t, evs)
	for _, a := range []string{"", "maybe", "allow", "ALLOW_ONCE", " allow_once", "opt-ao", `{"action":"accept"}`, "cancelled"} {
		_, err := e.answer(t, "s", ia.GetId(), a)
		wantErr(t, err, 400, "bad_request")
	}
	_, err = e.answer(t, "s", "call_nope", "allow_once")
	wantErr(t, err, 404, "interaction_unknown")
	_, err = e.answer(t, "other-session", ia.GetId(), "allow_once")
	wantErr(t, err, 404, "interaction_unknown")
	_, err = e.answer(t, "s", strings.Repeat("x", 129), "allow_once")
	wantErr(t, err, 400, "bad_request")
	// Still paused, and still answerable.
	if st := e.status(t); st.GetPausedRuns() != 1 {
		t.Fatalf("refused answers changed the run: %v", st)
	}
	evs, err = e.answer(t, "s", ia.GetId(), "allow_once")
	mustOK(t, err)
	if got := text(evs); got != "permission: opt-ao" {
		t.Fatalf("got %q", got)
	}
}

func TestQuestion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	refused := []string{
		``, `not json`, `[]`, `{"action":"accept"}`, `{"action":"accept","content":{}}`,
		`{"action":"accept","content":{"name":1}}`, `{"action":"accept","content":{"name":"a","color":"green"}}`,
		`{"action":"accept","content":{"name":"a","age":1.5}}`, `{"action":"accept","content":{"name":"a","age":"1"}}`,
		`{"action":"accept","content":{"name":"a","agree":"yes"}}`, `{"action":"accept","content":{"name":"a","ratio":"x"}}`,
		`{"action":"accept","content":{"name":"a","extra":1}}`, `{"action":"maybe"}`, `{"action":"decline","content":{}}`,
		`{"action":"accept","content":{"name":"a"},"more":1}`, `{"action":"accept","content":{"name":"a"}} {}`, `allow_once`,
	}
	cases := []struct {
		script, answer, want string
		end                  pb.Finished_Reason
	}{
		{"ask", `{"action":"accept","content":{"name":"Ada","color":"blue","age":36,"agree":true,"ratio":0.5}}`, `accept {"age":36,"agree":true,"color":"blue","name":"Ada","ratio":0.5}`, pb.Finished_REASON_STOP},
		{"ask", `{"action":"accept","content":{"name":"Ada"}}`, `accept {"name":"Ada"}`, pb.Finished_REASON_STOP},
		{"ask", `{"action":"decline"}`, `decline`, pb.Finished_REASON_STOP},
		{"asknometa", `{"action":"accept","content":{"name":"Bo"}}`, `accept {"name":"Bo"}`, pb.Finished_REASON_STOP},
	}
	// The fields in name order, as the daemon lists them.
	wantQuestion := &pb.Question{Message: "Tell me about you", Fields: []*pb.Field{
		{Name: "age", Type: "integer"},
		{Name: "agree", Type: "boolean"},
		{Name: "color", Type: "string", Options: []string{"red", "blue"}},
		{Name: "name", Type: "string", Required: true},
		{Name: "ratio", Type: "number"},
	}}
	for i, c := range cases {
		sid := "q" + string(rune('a'+i))
		evs, err := e.start(t, sid, c.script, selfDrive) // questions are asked whatever the mode
		mustOK(t, err)
		ia := interactionOf(t, evs)
		if d := cmp.Diff(wantQuestion, ia.GetQuestion(), protocmp.Transform()); d != "" {
			t.Fatalf("question (-want +got):\n%s", d)
		}
		if i == 0 {
			for _, a := range refused {
				_, err := e.answer(t, sid, ia.GetId(), a)
				wantErr(t, err, 400, "bad_request")
			}
		}
		evs, err = e.answer(t, sid, ia.GetId(), c.answer)
		mustOK(t, err)
		if f := finish(t, evs); f.GetReason() != c.end {
			t.Fatalf("%s: want %v got %v", c.answer, c.end, f)
		}
		if got := text(evs); got != c.want {
			t.Fatalf("%s: agent got %q want %q", c.answer, got, c.want)
		}
	}
}

// A cancel answer answers the agent cancelled and ends the run: the
// stream shows Finished ENDED 410 run_ended (ADR 0007).
func TestCancelAnswerEndsRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct{ script, answer string }{{"perm", "cancel"}, {"ask", `{"action":"cancel"}`}} {
		evs, err := e.start(t, c.script, c.script, manual)
		mustOK(t, err)
		ia := interactionOf(t, evs)
		evs, err = e.answer(t, c.script, ia.GetId(), c.answer)
		mustOK(t, err)
		if !started(t, evs).GetContinuation() {
			t.Fatal("want a continuation")
		}
		checkFinished(t, "cancel answer", finish(t, evs), runEnded)
		if m := evs[len(evs)-1].GetModel(); m != "" {
			t.Fatalf("cancel answer: model %q on Finished", m)
		}
		_, err = e.answer(t, c.script, ia.GetId(), c.answer)
		wantErr(t, err, 409, "interaction_not_pending")
		// The session is free again.
		_, err = e.start(t, c.script, "hello", manual)
		mustOK(t, err)
	}
}

func TestDeadlineCancelsPausedRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *internd.Config) { c.InteractionDeadline = 300 * time.Millisecond })
	evs, err := e.start(t, "s", "perm", manual)
	mustOK(t, err)
	ia := interactionOf(t, evs)
	if d := time.Until(ia.GetDeadline().AsTime()); d > 300*time.Millisecond {
		t.Fatalf("deadline %v", d)
	}
	e.waitStatus(t, "no paused run", func(s *pb.StatusResponse) bool { return s.GetPausedRuns() == 0 && s.GetLiveRuns() == 0 })
	_, err = e.answer(t, "s", ia.GetId(), "allow_once")
	wantErr(t, err, 409, "interaction_not_pending")
	// The run's log ends with ENDED run_ended.
	rest, err := e.attach(t, "s", started(t, evs).GetRunId(), evs[len(evs)-1].GetSeq()+1)
	mustOK(t, err)
	checkFinished(t, "after the deadline", finish(t, rest), runEnded)
}

func TestRejectedReplyDoesNotExtendDeadline(t *testing.T) {
	t.Parallel()
	const deadline = time.Second
	e := newEnv(t, func(c *internd.Config) { c.InteractionDeadline = deadline })
	evs, err := e.start(t, "s", "perm", manual)
	mustOK(t, err)
	ia := interactionOf(t, evs)
	due := ia.GetDeadline().AsTime()
	// Half-way, a rejected reply. The daemon's deadline is a real timer,
	// so half-way is a real half second: the one wait here that is not
	// for a condition.
	time.Sleep(time.Until(due.Add(-deadline / 2)))
	_, err = e.answer(t, "s", ia.GetId(), "nope")
	wantErr(t, err, 400, "bad_request")
	// Had the reply extended the deadline, the run would still be paused
	// half a deadline past the original one.
	var st *pb.StatusResponse
	if !testutil.Poll(time.Until(due.Add(deadline/2)), func() bool { st = e.status(t); return st.GetPausedRuns() == 0 }) {
		t.Fatalf("still paused half a deadline past it: %v", st)
	}
	_, err = e.answer(t, "s", ia.GetId(), "allow_once")
	wantErr(t, err, 409, "interaction_not_pending")
}

func TestConcurrentAnswersOneWins(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "s", "perm", manual)
	mustOK(t, err)
	ia := interactionOf(t, evs)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	outs := make([][]*pb.RunEvent, n)
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			outs[i], errs[i] = e.answer(t, "s", ia.GetId(), []string{"allow_once", "reject_once"}[i%2])
		})
	}
	close(gate)
	wg.Wait()
	wins := 0
	for i := range n {
		if errs[i] == nil {
			wins++
			if f := finish(t, outs[i]); f.GetReason() != pb.Finished_REASON_STOP {
				t.Fatalf("winner: %v", f)
			}
			continue
		}
		wantErr(t, errs[i], 409, "interaction_not_pending")
	}
	if wins != 1 {
		t.Fatalf("%d answers won, want exactly 1", wins)
	}
}

func TestBusySession(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.c.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{SessionId: "s", Prompt: "hang"}))
	mustOK(t, err)
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	_, err = e.start(t, "s", "hello", selfDrive)
	wantErr(t, err, 409, "busy")
	wantRetryAfter(t, err, apierr.RetryBusySession)
	// A paused run holds its session too.
	evs, err := e.start(t, "p", "perm", manual)
	mustOK(t, err)
	ia := interactionOf(t, evs)
	_, err = e.start(t, "p", "hello", selfDrive)
	wantErr(t, err, 409, "busy")
	// It says what it waits for, not that a turn is running.
	if msg := apierr.FromConnect(err).Message; !strings.Contains(msg, ia.GetId()) || !strings.Contains(msg, "tool_call_id") || strings.Contains(msg, "running") {
		t.Fatalf("paused session's 409 should name interaction %q and say to answer it: %q", ia.GetId(), msg)
	}
	// A running turn's 409 says so.
	_, err = e.start(t, "s", "hello", selfDrive)
	if msg := apierr.FromConnect(err).Message; !strings.Contains(msg, "another turn is running") {
		t.Fatalf("running session's 409: %q", msg)
	}
	// Another session is free.
	_, err = e.start(t, "other", "hello", selfDrive)
	mustOK(t, err)
}

func TestConsumerDisconnectCancelsStreamingRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := e.c.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{SessionId: "s", Prompt: "hang"}))
	mustOK(t, err)
	var evs []*pb.RunEvent
	for len(evs) < 2 && s.Receive() {
		evs = append(evs, s.Msg().GetEvent())
	}
	if text(evs) != "hanging" {
		t.Fatalf("got %v %v", evs, s.Err())
	}
	cancel()
	e.waitStatus(t, "no live run", func(s *pb.StatusResponse) bool { return s.GetLiveRuns() == 0 })
	rest, err := e.attach(t, "s", started(t, evs).GetRunId(), 3)
	mustOK(t, err)
	checkFinished(t, "consumer gone", finish(t, rest), runEnded)
	_, err = e.start(t, "s", "hello", selfDrive)
	mustOK(t, err)
}

// A consumer that goes away while its run is paused does not end the run:
// neither one that read the interaction and left before reading PAUSED,
// nor one that left while its stream stalled (it read nothing after
// Started, its HTTP/2 window of one byte shut): the daemon then learns of
// the departure from a failed send, the run paused meanwhile.
func TestPausedRunSurvivesConsumer(t *testing.T) {
	t.Parallel()
	for _, stall := range []bool{false, true} {
		t.Run(map[bool]string{false: "left after the interaction", true: "left stalled"}[stall], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			c := e.c
			if stall {
				tr := testutil.H2CTransport()
				tr.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerStream: 1}
				c = interndv1connect.NewInternDaemonServiceClient(&http.Client{Transport: testutil.Bearer(launch.GatewayCredential(secret), tr)}, e.srv.URL)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := c.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{SessionId: "s", Prompt: "perm", ApprovalMode: manual}))
			mustOK(t, err)
			if !s.Receive() {
				t.Fatalf("no Started: %v", s.Err())
			}
			runID := started(t, []*pb.RunEvent{s.Msg().GetEvent()}).GetRunId()
			if stall {
				e.waitStatus(t, "the run paused", func(s *pb.StatusResponse) bool { return s.GetPausedRuns() == 1 })
			} else {
				for s.Receive() {
					if s.Msg().GetEvent().GetInteraction() != nil {
						break
					}
				}
			}
			cancel() // gone before reading PAUSED
			// Once the daemon has noticed the consumer left (it detaches, so
			// a new attach is admitted), the run must still be paused.
			evs, err := e.attachOnceFree(t, "s", runID, 1)
			mustOK(t, err)
			if f := finish(t, evs); f.GetReason() != pb.Finished_REASON_PAUSED {
				t.Fatalf("the consumer's departure ended the paused run: %v", f)
			}
			if st := e.status(t); st.GetPausedRuns() != 1 {
				t.Fatalf("paused run did not survive: %v", st)
			}
			evs, err = e.answer(t, "s", interactionOf(t, evs).GetId(), "allow_once")
			mustOK(t, err)
			if text(evs) != "permission: opt-ao" {
				t.Fatalf("got %q", text(evs))
			}
		})
	}
}

func TestCancelRPC(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *internd.Config) { c.CancelGrace = 300 * time.Millisecond })
	for _, script := range []string{"hang", "hanghard"} {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := e.c.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{SessionId: script, Prompt: script}))
		mustOK(t, err)
		s.Receive()
		res, err := e.c.Cancel(context.Background(), connect.NewRequest(&pb.CancelRequest{SessionId: script}))
		mustOK(t, err)
		if !res.Msg.GetCancelled() {
			t.Fatal("want cancelled")
		}
		evs, err := drain[pb.StartTurnResponse](s)
		mustOK(t, err)
		checkFinished(t, script, finish(t, evs), runEnded)
		cancel()
		res, err = e.c.Cancel(context.Background(), connect.NewRequest(&pb.CancelRequest{SessionId: script}))
		mustOK(t, err)
		if res.Msg.GetCancelled() {
			t.Fatal("nothing to cancel any more")
		}
	}
}

func TestStopReasons(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct {
		script string
		reason pb.Finished_Reason
		code   int32
		why    string
	}{
		{"stop end_turn", pb.Finished_REASON_STOP, 0, ""},
		{"stop max_tokens", pb.Finished_REASON_STOP, 0, ""},
		{"stop max_turn_requests", pb.Finished_REASON_STOP, 0, ""},
		{"stop refusal", pb.Finished_REASON_ERROR, 502, "turn_failed"},
		{"stop cancelled", pb.Finished_REASON_ENDED, 410, "run_ended"},
		{"stop bogus", pb.Finished_REASON_ERROR, 502, "turn_failed"},
		{"fail", pb.Finished_REASON_ERROR, 502, "turn_failed"},
		{"timeout", pb.Finished_REASON_ERROR, 504, "timeout"},
	} {
		evs, err := e.start(t, "s", c.script, selfDrive)
		mustOK(t, err)
		f := finish(t, evs)
		checkFinished(t, c.script, f, &pb.Finished{Reason: c.reason, Code: c.code, ErrorReason: c.why})
		if c.script == "fail" && !strings.Contains(f.GetMessage(), "HTTP 500: boom") {
			t.Fatalf("agent's failure message lost: %q", f.GetMessage())
		}
		if (c.reason == pb.Finished_REASON_STOP) == (evs[len(evs)-1].GetModel() == "") {
			t.Fatalf("%s: model on Finished: %q", c.script, evs[len(evs)-1].GetModel())
		}
	}
}

func TestAgentCrashMidTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "s", "crash", selfDrive)
	mustOK(t, err)
	if text(evs) != "about to crash" {
		t.Fatalf("got %v", evs)
	}
	checkFinished(t, "crash", finish(t, evs), &pb.Finished{Reason: pb.Finished_REASON_ERROR, Code: 502, ErrorReason: "turn_failed"})
	st := e.waitStatus(t, "agent error", func(s *pb.StatusResponse) bool { return s.GetAgentError() != "" })
	if !strings.Contains(st.GetAgentError(), "exited") {
		t.Fatalf("agent error: %q", st.GetAgentError())
	}
	// The next turn starts a new agent, and the session goes on.
	evs, err = e.start(t, "s", "hello", selfDrive)
	mustOK(t, err)
	if finish(t, evs).GetReason() != pb.Finished_REASON_STOP || e.status(t).GetAgentError() != "" {
		t.Fatal("agent not restarted")
	}
}

func TestAgentNeverInitializes(t *testing.T) {
	t.Parallel()
	cmd, agentEnv := agentCommand("noinit")
	e := newEnv(t, func(c *internd.Config) {
		c.AgentCommand, c.AgentEnv, c.InitTimeout = cmd, agentEnv, 300*time.Millisecond
	})
	if err := e.d.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "initialize") {
		t.Fatalf("Start: %v", err)
	}
	st := e.status(t)
	if !strings.Contains(st.GetAgentError(), "did not answer initialize") || st.GetAgent() != "" {
		t.Fatalf("status: %v", st)
	}
	_, err := e.start(t, "s", "hello", selfDrive)
	wantErr(t, err, 502, "turn_failed")
	// The daemon still serves, and the refused turn left the session free.
	_, err = e.start(t, "s", "hello", selfDrive)
	wantErr(t, err, 502, "turn_failed")
}

func TestRetentionAndAttach(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *internd.Config) { c.RetainEvents = 5 })
	// No two deltas share a model, so none is coalesced: Started, 12
	// deltas, Finished.
	evs, err := e.start(t, "s", "altstream 12", selfDrive)
	mustOK(t, err)
	if text(evs) != strings.Repeat("x", 12) || len(evs) != 14 {
		t.Fatalf("live consumer should see all output: %d events, %q", len(evs), text(evs))
	}
	run, last := started(t, evs).GetRunId(), evs[len(evs)-1].GetSeq()
	// At the bound: the 5 retained events replay.
	got, err := e.attach(t, "s", run, last-4)
	mustOK(t, err)
	if len(got) != 5 || got[0].GetSeq() != last-4 || finish(t, got).GetReason() != pb.Finished_REASON_STOP {
		t.Fatalf("replay: %v", got)
	}
	// Past it: dropped.
	_, err = e.attach(t, "s", run, last-5)
	wantErr(t, err, 410, "attachment_failed")
	_, err = e.attach(t, "s", run, 1)
	wantErr(t, err, 410, "attachment_failed")
	_, err = e.attach(t, "s", "no-such-run", 1)
	wantErr(t, err, 404, "not_found")
	_, err = e.attach(t, "s", run, last+2)
	wantErr(t, err, 400, "bad_request")
}

func TestSecondAttachmentRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.c.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{SessionId: "s", Prompt: "hang"}))
	mustOK(t, err)
	s.Receive()
	run := s.Msg().GetEvent().GetRunId()
	_, err = e.attach(t, "s", run, 1)
	wantErr(t, err, 409, "attachment_failed")
	if st := e.status(t); st.GetLiveRuns() != 1 {
		t.Fatalf("refused attach disturbed the run: %v", st)
	}
}

func TestMaxPausedRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *internd.Config) { c.MaxPausedRuns = 2 })
	// At the bound: two runs paused.
	for _, sid := range []string{"a", "b"} {
		evs, err := e.start(t, sid, "perm", manual)
		mustOK(t, err)
		interactionOf(t, evs)
	}
	// Past it: refused before the stream, with when to retry.
	_, err := e.start(t, "c", "hello", selfDrive)
	wantErr(t, err, 503, "busy")
	wantRetryAfter(t, err, apierr.RetryPaused)
	if st := e.status(t); st.GetPausedRuns() != 2 || st.GetLiveRuns() != 0 {
		t.Fatalf("status: %v", st)
	}
}

// One caller fills only its own share of the paused runs: its turns that
// do not pause still run, one that asks a question fails 503 busy, other
// callers still start and pause, and answering one of its runs gives it
// room again.
func TestMaxPausedRunsPerCaller(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *internd.Config) { c.MaxPausedRuns = 10; c.MaxPausedPerCaller = 2 })
	var ias []string
	for _, sid := range []string{"a1", "a2"} {
		evs, err := e.startAs(t, "key:a", sid, "perm", manual)
		mustOK(t, err)
		ias = append(ias, interactionOf(t, evs).GetId())
	}
	// The share is about pauses: a plain turn of the same caller runs.
	evs, err := e.startAs(t, "key:a", "a3", "hello", selfDrive)
	mustOK(t, err)
	if f := evs[len(evs)-1].GetFinished(); f.GetReason() != pb.Finished_REASON_STOP {
		t.Fatalf("a plain turn at the caller's share: %v", f)
	}
	// A turn of it that would pause fails busy when it asks.
	evs, err = e.startAs(t, "key:a", "a4", "perm", manual)
	mustOK(t, err)
	if f := evs[len(evs)-1].GetFinished(); f.GetReason() != pb.Finished_REASON_ERROR || f.GetCode() != 503 ||
		f.GetErrorReason() != "busy" || !strings.Contains(f.GetMessage(), "one caller") {
		t.Fatalf("a pausing turn past the caller's share: %v", f)
	}
	evs, err = e.startAs(t, "user:b", "b1", "perm", manual)
	mustOK(t, err)
	interactionOf(t, evs)
	if st := e.status(t); st.GetPausedRuns() != 3 {
		t.Fatalf("status: %v", st)
	}
	// Answering one of its runs gives the caller room again.
	_, err = e.answer(t, "a1", ias[0], "allow_once")
	mustOK(t, err)
	evs, err = e.startAs(t, "key:a", "a5", "perm", manual)
	mustOK(t, err)
	interactionOf(t, evs)
	if st := e.status(t); st.GetPausedRuns() != 3 {
		t.Fatalf("after an answer: %v", st)
	}
	// A caller name of 128 characters is taken; 129 is a bad request.
	_, err = e.startAs(t, strings.Repeat("c", 128), "c0", "hello", selfDrive)
	mustOK(t, err)
	_, err = e.startAs(t, strings.Repeat("c", 129), "c1", "hello", selfDrive)
	wantErr(t, err, 400, "bad_request")
}

func TestPauseBeyondBoundFailsBusy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *internd.Config) { c.MaxPausedRuns = 1 })
	// Both turns start before either pauses (the agent asks only once
	// both prompts have reached it); only one can pause.
	var wg sync.WaitGroup
	var fins [2]*pb.Finished
	for i, sid := range []string{"a", "b"} {
		wg.Go(func() {
			evs, err := e.start(t, sid, "pairperm", manual)
			if err == nil && len(evs) > 0 {
				fins[i] = evs[len(evs)-1].GetFinished()
			}
		})
	}
	wg.Wait()
	paused, busy := 0, 0
	for _, f := range fins {
		switch {
		case f.GetReason() == pb.Finished_REASON_PAUSED:
			paused++
		case f.GetReason() == pb.Finished_REASON_ERROR && f.GetCode() == 503 && f.GetErrorReason() == "busy":
			busy++
		}
	}
	if paused != 1 || busy != 1 {
		t.Fatalf("want one PAUSED and one ERROR 503 busy, got %v", fins)
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "s", "len "+strings.Repeat("é", 32000-4), selfDrive)
	mustOK(t, err)
	if text(evs) != "32000" {
		t.Fatalf("agent got %s characters", text(evs))
	}
	_, err = e.start(t, "s", "len "+strings.Repeat("é", 32000-3), selfDrive)
	wantErr(t, err, 400, "bad_request")

	long := strings.Repeat("s", 256)
	evs, err = e.start(t, long, "hello", selfDrive)
	mustOK(t, err)
	if started(t, evs).GetSessionId() != long {
		t.Fatal("256-character session id not kept")
	}
	_, err = e.start(t, long+"s", "hello", selfDrive)
	wantErr(t, err, 400, "bad_request")
	_, err = e.start(t, "s", "hello", pb.ApprovalMode(9))
	wantErr(t, err, 400, "bad_request")
	if st := e.status(t); st.GetSessions() != 2 {
		t.Fatalf("refused turns created sessions: %v", st)
	}
}

func TestRestartKeepsSessions(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"1", "load"} {
		t.Run("agent="+mode, func(t *testing.T) {
			cmd, agentEnv := agentCommand(mode)
			e := newEnv(t, func(c *internd.Config) { c.AgentCommand, c.AgentEnv = cmd, agentEnv })
			evs, err := e.start(t, "keep", "whoami", selfDrive)
			mustOK(t, err)
			before := text(evs)
			e.srv.Close()
			e.d.Close()

			e2 := startEnv(t, e.cfg)
			if st := e2.status(t); st.GetSessions() != 1 {
				t.Fatalf("sessions after restart: %v", st)
			}
			evs, err = e2.start(t, "keep", "whoami", selfDrive)
			mustOK(t, err)
			if started(t, evs).GetSessionId() != "keep" {
				t.Fatal("session id not kept")
			}
			after := text(evs)
			if mode == "load" && after != before {
				t.Fatalf("agent with session/load should keep its session: %q then %q", before, after)
			}
			if mode == "1" && (after == before || after == "") {
				t.Fatalf("agent without session/load needs a new agent session: %q then %q", before, after)
			}
			if strings.Contains(text(evs), "replayed") {
				t.Fatal("a session/load replay leaked into the stream")
			}
			// The history survived the restart: both turns are on disk.
			files, _ := filepath.Glob(filepath.Join(e.cfg.DataDir, "sessions", "*.json*"))
			if len(files) != 1 || filepath.Ext(files[0]) != ".jsonl" {
				t.Fatalf("session files: %v", files)
			}
			b, _ := os.ReadFile(files[0])
			lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
			b = lines[len(lines)-1] // the journal's last record is the session
			type turn struct{ Prompt, Reply, End string }
			var rec struct {
				ID    string `json:"id"`
				Turns []turn
			}
			if err := json.Unmarshal(b, &rec); err != nil {
				t.Fatalf("history %s: %v", b, err)
			}
			if rec.ID != "keep" {
				t.Fatalf("history of session %q", rec.ID)
			}
			wantTurns := []turn{{Prompt: "whoami", Reply: before, End: "end_turn"}, {Prompt: "whoami", Reply: after, End: "end_turn"}}
			if d := cmp.Diff(wantTurns, rec.Turns); d != "" {
				t.Fatalf("history turns (-want +got):\n%s", d)
			}
		})
	}
}

// A stream that breaks without a Finished event is what the gateway
// reports as stream_severed; the daemon cancels the run it was streaming.
func TestSeveredStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s, err := e.c.StartTurn(context.Background(), connect.NewRequest(&pb.StartTurnRequest{SessionId: "s", Prompt: "hang"}))
	mustOK(t, err)
	var evs []*pb.RunEvent
	for len(evs) < 2 && s.Receive() {
		evs = append(evs, s.Msg().GetEvent())
	}
	e.srv.CloseClientConnections()
	rest, err := drain[pb.StartTurnResponse](s)
	if err == nil {
		t.Fatal("a severed stream must end in an error")
	}
	for _, ev := range rest {
		if ev.GetFinished() != nil {
			t.Fatalf("severed stream delivered Finished: %v", ev)
		}
	}
	e.waitStatus(t, "run cancelled", func(s *pb.StatusResponse) bool { return s.GetLiveRuns() == 0 })
	// The severed consumer detaches when its handler notices the broken
	// stream, which may come just after the run ended.
	after, err := e.attachOnceFree(t, "s", started(t, evs).GetRunId(), 3)
	mustOK(t, err)
	if f := finish(t, after); f.GetReason() != pb.Finished_REASON_ENDED {
		t.Fatalf("want ENDED, got %v", f)
	}
}

// The agent (and what it runs) gets the daemon's environment through an
// allowlist: never Cohort's own settings, such as the daemon secret, nor
// anything else the host or the operator's shell holds (a cloud key, a
// token); the built-in agent's COHORT_AGENT_* settings and the basics
// (PATH, HOME, locale, time zone, proxies) pass.
func TestAgentEnvironment(t *testing.T) {
	token := fmt.Sprintf("tok-%d", time.Now().UnixNano())
	t.Setenv("COHORT_INTERN_SECRET", "leaked-secret")
	t.Setenv("COHORT_DATABASE_URL", "postgres://user:pw@db/x")
	t.Setenv("COHORT_AGENT_API_KEY", "for-the-agent")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
	t.Setenv("FOO_TOKEN", token)
	t.Setenv("OPENAI_API_KEY", "sk-not-this-one") // COHORT_AGENT_API_KEY wins
	t.Setenv("OPENAI_BASE_URL", "http://models.example/v1")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer x")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Setenv("HOME", "/home/op")
	t.Setenv("LANG", "C.UTF-8")
	t.Setenv("LC_TIME", "C")
	t.Setenv("TZ", "UTC")
	t.Setenv("NO_PROXY", "internal.example")
	e := newEnv(t)
	for name, want := range map[string]string{"COHORT_INTERN_SECRET": "[]", "COHORT_DATABASE_URL": "[]",
		"AWS_SECRET_ACCESS_KEY": "[]", "FOO_TOKEN": "[]", "OPENAI_API_KEY": "[]", "OPENAI_BASE_URL": "[]",
		"OTEL_EXPORTER_OTLP_HEADERS": "[]",
		"COHORT_AGENT_API_KEY":       "[for-the-agent]", "COHORT_AGENT_MODEL": "[cohort/demo]",
		"COHORT_AGENT_BASE_URL": "[http://models.example/v1]",
		"PATH":                  "[" + os.Getenv("PATH") + "]", "HOME": "[/home/op]", "LANG": "[C.UTF-8]", "LC_TIME": "[C]",
		"TZ": "[UTC]", "NO_PROXY": "[internal.example]", "OTEL_BSP_SCHEDULE_DELAY": "[50]",
		// The catalog's (here the test harness's) own settings are added.
		"INTERND_TEST_AGENT": "[1]"} {
		evs, err := e.start(t, "s", "env "+name, selfDrive)
		mustOK(t, err)
		if got := text(evs); got != want {
			t.Fatalf("%s: agent sees %s, want %s", name, got, want)
		}
	}
}

// Elicitations the daemon cannot carry to a caller are answered cancel:
// URL elicitations, and ones without a session when several turns run.
func TestElicitationsNotCarried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "u", "askurl", manual)
	mustOK(t, err)
	if got := text(evs); got != "cancel" || finish(t, evs).GetReason() != pb.Finished_REASON_STOP {
		t.Fatalf("URL elicitation: %q %v", got, evs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.c.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{SessionId: "other", Prompt: "hang"}))
	mustOK(t, err)
	s.Receive()
	evs, err = e.start(t, "q", "asknometa", manual)
	mustOK(t, err)
	if got := text(evs); got != "cancel" {
		t.Fatalf("ambiguous elicitation: %q", got)
	}
}

func TestFinishedRunEventsExpire(t *testing.T) {
	t.Parallel()
	const ttl = 200 * time.Millisecond
	e := newEnv(t, func(c *internd.Config) { c.FinishedRunTTL = ttl })
	evs, err := e.start(t, "s", "hello", selfDrive)
	mustOK(t, err)
	run, last := started(t, evs).GetRunId(), evs[len(evs)-1].GetSeq()
	// Soon after the end: replayable; past its end there is nothing to wait for.
	got, err := e.attach(t, "s", run, 1)
	mustOK(t, err)
	if len(got) != len(evs) {
		t.Fatalf("replay: %d events, want %d", len(got), len(evs))
	}
	_, err = e.attach(t, "s", run, last+1)
	wantErr(t, err, 410, "attachment_failed")
	// Within twice the TTL the events are gone.
	testutil.Poll(2*ttl, func() bool { _, err = e.attach(t, "s", run, 1); return err != nil })
	wantErr(t, err, 410, "attachment_failed")
}

// A question outlives the daemon process that asked it only as a record:
// after a restart the reply is 409 interaction_not_pending (the run ended
// with the process), while an id the session never asked stays 404.
func TestRestartEndsPausedRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	evs, err := e.start(t, "asked", "perm", manual)
	mustOK(t, err)
	ia := interactionOf(t, evs).GetId()
	e.srv.Close()
	e.d.Close()

	e2 := startEnv(t, e.cfg)
	_, err = e2.answer(t, "asked", ia, "allow_once")
	wantErr(t, err, 409, "interaction_not_pending")
	_, err = e2.answer(t, "asked", "never-asked", "allow_once")
	wantErr(t, err, 404, "interaction_unknown")
	_, err = e2.answer(t, "other-session", ia, "allow_once")
	wantErr(t, err, 404, "interaction_unknown")
}

// Sessions no run uses leave memory after SessionIdleTTL, their files
// stay, and the next turn reads them back (with the agent's session
// loaded again): memory follows the live sessions. A paused run's session
// stays.
func TestIdleSessionsLeaveMemory(t *testing.T) {
	t.Parallel()
	cmd, agentEnv := agentCommand("load")
	e := newEnv(t, func(c *internd.Config) {
		c.AgentCommand, c.AgentEnv = cmd, agentEnv
		c.FinishedRunTTL, c.SessionIdleTTL = 50*time.Millisecond, 200*time.Millisecond
	})
	evs, err := e.start(t, "idle", "whoami", selfDrive)
	mustOK(t, err)
	before := text(evs)
	evs, err = e.start(t, "held", "perm", manual)
	mustOK(t, err)
	interactionOf(t, evs)
	e.waitStatus(t, "the idle session out of memory", func(s *pb.StatusResponse) bool { return s.GetLiveSessions() == 1 })
	if st := e.status(t); st.GetSessions() != 2 || st.GetPausedRuns() != 1 {
		t.Fatalf("status: %v", st)
	}
	// Back from disk: the same session, the agent's session loaded again.
	evs, err = e.start(t, "idle", "whoami", selfDrive)
	mustOK(t, err)
	if started(t, evs).GetSessionId() != "idle" || text(evs) != before {
		t.Fatalf("after leaving memory: %q then %q", before, text(evs))
	}
	if st := e.status(t); st.GetLiveSessions() != 2 {
		t.Fatalf("status: %v", st)
	}
}

// Status says how long the daemon has gone without a call other than
// Status, whichever gateway replica made it: the fleet on a cluster puts
// an intern to sleep by it.
func TestStatusReportsIdleTime(t *testing.T) {
	clock := testutil.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e := newEnv(t, func(c *internd.Config) { c.Now = clock.Now })
	if got := e.status(t).GetIdleMs(); got != 0 {
		t.Fatalf("idle of a new daemon: %d ms", got)
	}
	clock.Add(90 * time.Second)
	if got := e.status(t).GetIdleMs(); got != 90_000 {
		t.Fatalf("idle after 90 s and a Status: %d ms", got)
	}
	if _, err := e.start(t, "s1", "hello", pb.ApprovalMode_APPROVAL_MODE_SELF_DRIVE); err != nil {
		t.Fatal(err)
	}
	if got := e.status(t).GetIdleMs(); got != 0 {
		t.Fatalf("idle right after a turn: %d ms", got)
	}
	clock.Add(5 * time.Second)
	if got := e.status(t).GetIdleMs(); got != 5_000 {
		t.Fatalf("idle 5 s after a turn: %d ms", got)
	}
}

// wantRetryAfter checks a daemon refusal says when to retry, in seconds.
func wantRetryAfter(t testing.TB, err error, seconds int) {
	t.Helper()
	if got := apierr.FromConnect(err).RetryAfter; got != seconds {
		t.Fatalf("Retry-After %d, want %d (%v)", got, seconds, err)
	}
}

// Memory follows the live sessions, not how many there were: past
// MaxIdleSessions (and a quarter) the least recently used leave memory
// at once, long before SessionIdleTTL, and come back from disk.
func TestIdleSessionsBounded(t *testing.T) {
	t.Parallel()
	cmd, agentEnv := agentCommand("load")
	e := newEnv(t, func(c *internd.Config) {
		c.AgentCommand, c.AgentEnv = cmd, agentEnv
		c.MaxIdleSessions = 4
	})
	first := ""
	for i := range 20 {
		evs, err := e.start(t, fmt.Sprintf("s%d", i), "whoami", selfDrive)
		mustOK(t, err)
		if i == 0 {
			first = text(evs)
		}
	}
	e.waitStatus(t, "sessions past the bound out of memory", func(s *pb.StatusResponse) bool {
		return s.GetLiveSessions() <= 5
	})
	if st := e.status(t); st.GetSessions() != 20 {
		t.Fatalf("status: %v", st)
	}
	// The oldest is read back from disk, the agent's session loaded again.
	evs, err := e.start(t, "s0", "whoami", selfDrive)
	mustOK(t, err)
	if text(evs) != first {
		t.Fatalf("after leaving memory: %q then %q", first, text(evs))
	}
}

// The daemon's live heap after 2,000 one-turn sessions is where it was
// after 500: what a forgotten session held (its runs, their contexts and
// expiry timers) is released, not kept for FinishedRunTTL. Not parallel:
// the heap is the process's.
func TestSessionMemoryFlat(t *testing.T) {
	cmd, agentEnv := agentCommand("load")
	e := newEnv(t, func(c *internd.Config) {
		c.AgentCommand, c.AgentEnv = cmd, agentEnv
		c.MaxIdleSessions = 64
	})
	live := func() uint64 {
		runtime.GC()
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	n := 0
	turns := func(upto int) {
		for ; n < upto; n++ {
			_, err := e.start(t, fmt.Sprintf("s%d", n), "whoami", selfDrive)
			mustOK(t, err)
		}
	}
	turns(500)
	before := live()
	turns(2000)
	after := live()
	t.Logf("live heap after 500 sessions %d KB, after 2,000 %d KB; %d in memory", before>>10, after>>10, e.status(t).GetLiveSessions())
	// Unbounded, 1,500 sessions kept about 3 KB each (4.5 MB).
	if after > before+1<<20 {
		t.Fatalf("the live heap grew by %d KB over 1,500 sessions", (after-before)>>10)
	}
}

// A detached run (a background run) goes on when its consumer goes away:
// another consumer attaches from where the first stopped and reads it to
// its end, and Cancel still ends it.
func TestDetachedRunSurvivesConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := e.c.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{SessionId: "s", Prompt: "hang", Detached: true}))
	mustOK(t, err)
	var evs []*pb.RunEvent
	for len(evs) < 2 && s.Receive() {
		evs = append(evs, s.Msg().GetEvent())
	}
	if text(evs) != "hanging" {
		t.Fatalf("got %v %v", evs, s.Err())
	}
	cancel()
	run := started(t, evs).GetRunId()
	var a *connect.ServerStreamForClient[pb.AttachResponse]
	actx, acancel := context.WithTimeout(context.Background(), time.Minute)
	defer acancel()
	testutil.Poll(10*time.Second, func() bool {
		a, err = e.c.Attach(actx, connect.NewRequest(&pb.AttachRequest{SessionId: "s", RunId: run, FromSeq: 2}))
		mustOK(t, err)
		if a.Receive() {
			return true
		}
		ae := apierr.FromConnect(a.Err())
		if ae.Status != 409 || ae.Reason != "attachment_failed" {
			t.Fatalf("attach: %v", a.Err())
		}
		return false
	})
	// The run is still live: its text replays from seq 2, nothing ended it.
	if ev := a.Msg().GetEvent(); ev.GetSeq() != 2 || ev.GetText().GetText() != "hanging" {
		t.Fatalf("attach replays %v", ev)
	}
	if st := e.status(t); st.GetLiveRuns() != 1 {
		t.Fatalf("the detached run ended with its consumer: %v", st)
	}
	res, err := e.c.Cancel(context.Background(), connect.NewRequest(&pb.CancelRequest{SessionId: "s"}))
	mustOK(t, err)
	if !res.Msg.GetCancelled() {
		t.Fatal("cancel found no run")
	}
	rest, err := drain[pb.AttachResponse](a)
	mustOK(t, err)
	checkFinished(t, "cancelled", finish(t, rest), runEnded)
}
