package internd_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/internd"
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
	srv := httptest.NewUnstartedServer(d.Handler())
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		d.Close()
	})
	return &env{d: d, srv: srv, c: newClient(srv.URL, secret), cfg: cfg}
}

// newClient speaks h2c (prior knowledge) and sends the bearer secret.
func newClient(url, tok string) interndv1connect.InternDaemonServiceClient {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: bearer{tok: tok, rt: &http.Transport{Protocols: &p}}}
	return interndv1connect.NewInternDaemonServiceClient(hc, url)
}

type bearer struct {
	tok string
	rt  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.tok != "" {
		r.Header.Set("Authorization", "Bearer "+b.tok)
	}
	return b.rt.RoundTrip(r)
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
	deadline := time.Now().Add(15 * time.Second)
	for {
		st := e.status(t)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never reached %s: %v", what, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wantErr checks a daemon error's HTTP status and reason.
func wantErr(t testing.TB, err error, status int, reason string) {
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

var errNone = errors.New("none")
