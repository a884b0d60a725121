package e2e_test

import (
	"io"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/agent/agenttest"
	"github.com/cohort-dev/cohort/internal/storetest"
	"github.com/cohort-dev/cohort/internal/testutil"
)

// Two gateway replicas on one PostgreSQL database and one remote daemon: a
// prompt streamed through replica A pauses, the answer goes through replica
// B, and the same run resumes. The gateway keeps no run state.
func TestReplicasShareRuns(t *testing.T) {
	c, a := newCluster(t, storetest.PostgresURL(t))
	b := c.Gateway(t, "--no-bootstrap")
	d := c.Daemon(t, c.Demo, nil)

	s := readAll(t, chat(t, a, c.WK, d.id, user("$ echo across-replicas", `"approval_mode":"manual"`)))
	if s.Finish != "tool_calls" {
		t.Fatalf("pause through A: %q", s.Finish)
	}
	r := readAll(t, chat(t, b, c.WK, d.id, s.answer("allow_once")))
	if r.Finish != "stop" || !strings.Contains(r.Text, "across-replicas") || r.Session != s.Session {
		t.Fatalf("resume through B: %q %q %v", r.Finish, r.Text, r.Session)
	}
	// The run has ended for both replicas.
	refusal(t, chat(t, a, c.WK, d.id, s.answer("allow_once")), 409, "interaction_not_pending")

	// A question asked through B is answered through A.
	q := readAll(t, chat(t, b, c.WK, d.id, user("shall we?")))
	r = readAll(t, chat(t, a, c.WK, d.id, q.answer(`{"action":"decline"}`)))
	if r.Finish != "stop" || !strings.Contains(r.Text, "declined") {
		t.Fatalf("decline through A: %q %q", r.Finish, r.Text)
	}
}

// A restarted gateway with remote daemons: the paused run lives on the
// daemon, so the reply to the new gateway process resumes it.
func TestRemotePauseSurvivesGatewayRestart(t *testing.T) {
	c, gw := newCluster(t, "")
	d := c.Daemon(t, c.Demo, nil)
	s := readAll(t, chat(t, gw, c.WK, d.id, user("$ echo after-restart", `"approval_mode":"manual"`)))
	if s.Finish != "tool_calls" {
		t.Fatalf("pause: %q", s.Finish)
	}
	gw.Stop(t)
	gw = c.Gateway(t)
	r := readAll(t, chat(t, gw, c.WK, d.id, s.answer("allow_once")))
	if r.Finish != "stop" || !strings.Contains(r.Text, "after-restart") {
		t.Fatalf("resume after restart: %q %q", r.Finish, r.Text)
	}
}

// A restarted gateway with the local provisioner: its daemons are its
// children and die with it (docs/decisions.md), so a paused run is lost.
// The new daemon keeps the session (on disk) but not the run: the reply is
// refused, and the session takes new turns.
func TestLocalPauseLostOnGatewayRestart(t *testing.T) {
	c, gw := newCluster(t, "", "--provisioner", "local")
	running := func(gw *proc) func() bool {
		return func() bool {
			res := chat(t, gw, c.WK, c.Demo, user("ready?x"))
			if res.StatusCode == 409 {
				refusal(t, res, 409, "intern_not_ready")
				return false
			}
			readAll(t, res)
			return true
		}
	}
	testutil.Eventually(t, wait, "the local daemon runs", running(gw))
	s := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ echo lost", `"approval_mode":"manual"`)))
	if s.Finish != "tool_calls" {
		t.Fatalf("pause: %q", s.Finish)
	}
	gw.Stop(t)
	gw = c.Gateway(t, "--provisioner", "local")
	testutil.Eventually(t, wait, "the restarted gateway's daemon runs", running(gw))
	refusal(t, chat(t, gw, c.WK, c.Demo, s.answer("allow_once")), 409, "interaction_not_pending")
	r := readAll(t, chat(t, gw, c.WK, c.Demo, user("still there", `"session_id":`+jsonStr(s.Session))))
	if r.Finish != "stop" {
		t.Fatalf("new turn in the session: %q", r.Finish)
	}
}

// The README's "point an intern at a real model" with the local provisioner:
// the endpoint and key come from the gateway's COHORT_AGENT_* environment,
// the model from the intern record, changed through UpdateIntern.
func TestLocalInternOnUpstreamModel(t *testing.T) {
	up := agenttest.NewUpstream(t, agenttest.Answer(upModel, 4, 2, "from the upstream"))
	dataDir := t.TempDir()
	c := &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	gw := c.GatewayEnv(t, upstreamEnv(up), "--provisioner", "local")
	c.load(t)
	connectCall(t, gw, c.MK, "UpdateIntern", `{"id":"`+c.Demo+`","model":"`+upModel+`"}`)
	testutil.Eventually(t, wait, "the intern answers from the upstream model", func() bool {
		res := chat(t, gw, c.WK, c.Demo, user("hello upstream"))
		if res.StatusCode != 200 {
			io.Copy(io.Discard, res.Body)
			return false
		}
		s := readAll(t, res)
		if s.Text == "from the upstream" && s.Finish == "stop" {
			return true
		}
		if !strings.Contains(s.Text, "cohort/demo") {
			t.Fatalf("neither demo nor upstream: %q", s.Text)
		}
		return false // the daemon still on the old model
	})
	reqs, auths := up.Requests(), up.Authorizations()
	if len(reqs) != 1 || reqs[0]["model"] != upModel || auths[0] != "Bearer e2e-upstream-key" {
		t.Fatalf("upstream saw %v %v", reqs, auths)
	}
}
