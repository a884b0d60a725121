package internd_test

import (
	"context"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("INTERND_TEST_AGENT"); mode != "" {
		runTestAgent(mode)
		return
	}
	os.Exit(m.Run())
}

const secret = "daemon-secret-for-tests"

// env is a daemon served over h2c with a client that carries its secret.
type env struct {
	d   *internd.Daemon
	srv *httptest.Server
	c   interndv1connect.InternDaemonServiceClient
	cfg internd.Config
}

// agentCommand re-executes the test binary as the scripted agent.
func agentCommand(mode string) ([]string, []string) {
	return []string{os.Args[0], "-test.run=^$"}, []string{"INTERND_TEST_AGENT=" + mode}
}

func newEnv(t testing.TB, configure ...func(*internd.Config)) *env {
	t.Helper()
	cmd, agentEnv := agentCommand("1")
	cfg := internd.Config{InternID: "intern-1", Secret: secret, DataDir: t.TempDir(), AgentCommand: cmd, AgentEnv: agentEnv,
		Model: "cohort/demo", InitTimeout: 10 * time.Second, CancelGrace: 2 * time.Second}
	for _, c := range configure {
		c(&cfg)
	}
	return startEnv(t, cfg)
}

func startEnv(t testing.TB, cfg internd.Config) *env {
	t.Helper()
	d, err := internd.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() }) // after the server has closed
	srv := testutil.ServeH2C(t, d.Handler())
	return &env{d: d, srv: srv, c: newClient(srv.URL, launch.GatewayCredential(secret)), cfg: cfg}
}

// newClient speaks h2c (prior knowledge) and sends tok as its bearer
// token (the gateway's credential, for a client that should get in).
func newClient(url, tok string) interndv1connect.InternDaemonServiceClient {
	return interndv1connect.NewInternDaemonServiceClient(testutil.H2CClient(tok), url)
}

type receiver[T any] interface {
	Receive() bool
	Msg() *T
	Err() error
	Close() error
}

type eventer interface{ GetEvent() *pb.RunEvent }

// drain reads a stream to its end and returns its events and error.
func drain[T any](s receiver[T]) ([]*pb.RunEvent, error) {
	var out []*pb.RunEvent
	for s.Receive() {
		out = append(out, any(s.Msg()).(eventer).GetEvent())
	}
	return out, s.Err()
}

func (e *env) start(t testing.TB, session, prompt string, mode pb.ApprovalMode) ([]*pb.RunEvent, error) {
	t.Helper()
	return e.startAs(t, "", session, prompt, mode)
}

// startAs is start on behalf of a caller (StartTurnRequest.caller).
func (e *env) startAs(t testing.TB, caller, session, prompt string, mode pb.ApprovalMode) ([]*pb.RunEvent, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := e.c.StartTurn(ctx, connect.NewRequest(&pb.StartTurnRequest{SessionId: session, Prompt: prompt, ApprovalMode: mode, Caller: caller}))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return drain[pb.StartTurnResponse](s)
}

func (e *env) answer(t testing.TB, session, ia, answer string) ([]*pb.RunEvent, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := e.c.Answer(ctx, connect.NewRequest(&pb.AnswerRequest{SessionId: session, InteractionId: ia, Answer: answer}))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return drain[pb.AnswerResponse](s)
}

func (e *env) attach(t testing.TB, session, run string, from uint64) ([]*pb.RunEvent, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := e.c.Attach(ctx, connect.NewRequest(&pb.AttachRequest{SessionId: session, RunId: run, FromSeq: from}))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return drain[pb.AttachResponse](s)
}

func (e *env) status(t testing.TB) *pb.StatusResponse {
	t.Helper()
	res, err := e.c.Status(context.Background(), connect.NewRequest(&pb.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg
}

// waitStatus polls Status until ok holds.
func (e *env) waitStatus(t testing.TB, what string, ok func(*pb.StatusResponse) bool) *pb.StatusResponse {
	t.Helper()
	var st *pb.StatusResponse
	if !testutil.Poll(15*time.Second, func() bool { st = e.status(t); return ok(st) }) {
		t.Fatalf("status never reached %s: %v", what, st)
	}
	return st
}

// attachOnceFree attaches to a run as soon as its former consumer has
// detached: until the daemon notices that consumer left, a second
// attachment is refused 409 attachment_failed.
func (e *env) attachOnceFree(t testing.TB, session, run string, from uint64) ([]*pb.RunEvent, error) {
	t.Helper()
	var evs []*pb.RunEvent
	var err error
	testutil.Poll(10*time.Second, func() bool {
		evs, err = e.attach(t, session, run, from)
		ae := apierr.FromConnect(err)
		return err == nil || ae.Status != 409 || ae.Reason != "attachment_failed"
	})
	return evs, err
}

// wantErr checks a daemon error's HTTP status and reason.
func wantErr(t testing.TB, err error, status int, reason apierr.Reason) {
	t.Helper()
	if err == nil {
		t.Fatalf("want error %d %s, got none", status, reason)
	}
	e := apierr.FromConnect(err)
	if e.Status != status || e.Reason != reason {
		t.Fatalf("want error %d %s, got %d %q (%v)", status, reason, e.Status, e.Reason, err)
	}
}

func mustOK(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// finish returns the stream's last event as a Finished, failing otherwise.
func finish(t testing.TB, evs []*pb.RunEvent) *pb.Finished {
	t.Helper()
	if len(evs) == 0 || evs[len(evs)-1].GetFinished() == nil {
		t.Fatalf("stream does not end with Finished: %v", evs)
	}
	return evs[len(evs)-1].GetFinished()
}

// runEnded is how a cancelled run ends.
var runEnded = &pb.Finished{Reason: pb.Finished_REASON_ENDED, Code: 410, ErrorReason: "run_ended"}

// checkFinished diffs how a run finished (reason, code, error reason; not
// the message) against want.
func checkFinished(t testing.TB, what string, got, want *pb.Finished) {
	t.Helper()
	if d := cmp.Diff(want, got, protocmp.Transform(), protocmp.IgnoreFields(&pb.Finished{}, "message")); d != "" {
		t.Fatalf("%s: Finished (-want +got):\n%s", what, d)
	}
}

func started(t testing.TB, evs []*pb.RunEvent) *pb.Started {
	t.Helper()
	if len(evs) == 0 || evs[0].GetStarted() == nil {
		t.Fatalf("stream does not begin with Started: %v", evs)
	}
	return evs[0].GetStarted()
}

func interactionOf(t testing.TB, evs []*pb.RunEvent) *pb.Interaction {
	t.Helper()
	if f := finish(t, evs); f.GetReason() != pb.Finished_REASON_PAUSED {
		t.Fatalf("want PAUSED, got %v", f)
	}
	if len(evs) < 2 || evs[len(evs)-2].GetInteraction() == nil {
		t.Fatalf("PAUSED not preceded by an Interaction: %v", evs)
	}
	return evs[len(evs)-2].GetInteraction()
}

func text(evs []*pb.RunEvent) string {
	s := ""
	for _, ev := range evs {
		s += ev.GetText().GetText()
	}
	return s
}

func checkSeqs(t testing.TB, evs []*pb.RunEvent) {
	t.Helper()
	for i := 1; i < len(evs); i++ {
		if evs[i].GetSeq() != evs[i-1].GetSeq()+1 {
			t.Fatalf("seqs not consecutive at %d: %d then %d", i, evs[i-1].GetSeq(), evs[i].GetSeq())
		}
	}
}
