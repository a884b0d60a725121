package e2e_test

import (
	"io"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
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

// A restarted gateway with the local provisioner: the jails outlive the
// gateway (--jail-orphan-timeout) and the new one adopts them, so a run
// paused before the restart resumes after it, in the same daemon, whether
// the gateway stopped gracefully or was killed. A jail left without a
// gateway for longer than the timeout stops by itself.
func TestLocalPauseSurvivesGatewayRestart(t *testing.T) {
	flags := []string{"--provisioner", "local", "--jail-orphan-timeout", "1m", "--log-level", "info"}
	c, gw := newCluster(t, "", flags...)
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
	pid := daemonPID(t, gw, c.Demo)
	for _, stop := range []struct {
		name string
		stop func(*proc)
	}{{"SIGTERM", func(p *proc) { p.Stop(t) }}, {"SIGKILL", func(p *proc) { p.Kill() }}} {
		s := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ echo survives-"+stop.name, `"approval_mode":"manual"`)))
		if s.Finish != "tool_calls" {
			t.Fatalf("pause: %q", s.Finish)
		}
		stop.stop(gw)
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("the jail (pid %d) ended with its gateway (%s): %v", pid, stop.name, err)
		}
		gw = c.Gateway(t, flags...)
		r := readAll(t, chat(t, gw, c.WK, c.Demo, s.answer("allow_once")))
		if r.Finish != "stop" || !strings.Contains(r.Text, "survives-"+stop.name) {
			t.Fatalf("resume after the gateway's %s: %q %q\n%s", stop.name, r.Finish, r.Text, tail(gw.stderr.String(), 3000))
		}
		testutil.Eventually(t, wait, "the new gateway adopts the jail", func() bool {
			return strings.Contains(gw.stderr.String(), "adopted from a previous gateway")
		})
		if got := daemonPID(t, gw, c.Demo); got != pid {
			t.Errorf("after the gateway's %s the daemon is pid %d, not the adopted %d", stop.name, got, pid)
		}
	}

	// Changed while no gateway ran: a jail that runs another model is
	// replaced; one whose intern was suspended is stopped.
	gw.Stop(t)
	c.Admin(t, "intern", "update", "--org", c.Org, "--id", c.Demo, "--model", "cohort/demo-b")
	gw = c.Gateway(t, flags...)
	testutil.Eventually(t, wait, "the jail of another model stops", func() bool { return syscall.Kill(pid, 0) != nil })
	testutil.Eventually(t, wait, "a new jail runs", func() bool {
		return strings.Count(gw.stderr.String(), `"msg":"intern daemon running"`) == 1
	})
	if !strings.Contains(gw.stderr.String(), "another configuration") {
		t.Errorf("the gateway did not say why it replaced the jail:\n%s", tail(gw.stderr.String(), 3000))
	}
	pid = daemonPID(t, gw, c.Demo)
	gw.Stop(t)
	c.Admin(t, "intern", "suspend", "--org", c.Org, "--id", c.Demo)
	gw = c.Gateway(t, flags...)
	testutil.Eventually(t, wait, "the suspended intern's jail stops", func() bool { return syscall.Kill(pid, 0) != nil })
	c.Admin(t, "intern", "update", "--org", c.Org, "--id", c.Demo, "--model", "cohort/demo")
	c.Admin(t, "intern", "resume", "--org", c.Org, "--id", c.Demo)

	// With no gateway for longer than the orphan timeout the jail stops.
	gw.Stop(t)
	gw = c.Gateway(t, "--provisioner", "local", "--jail-orphan-timeout", "0", "--log-level", "info")
	testutil.Eventually(t, wait, "the restarted gateway's daemon runs", running(gw))
	pid = daemonPID(t, gw, c.Demo)
	gw.Kill()
	testutil.Eventually(t, wait, "the orphaned jail stops", func() bool { return syscall.Kill(pid, 0) != nil })
}

// daemonPID is the pid of the intern's jail (its init) as gw last logged it.
func daemonPID(t *testing.T, gw *proc, intern string) int {
	t.Helper()
	re := regexp.MustCompile(`"msg":"intern daemon running","intern":"` + intern + `".*?"pid":(\d+)`)
	m := re.FindAllStringSubmatch(gw.stderr.String(), -1)
	if len(m) == 0 {
		t.Fatalf("the gateway logged no daemon of %s:\n%s", intern, tail(gw.stderr.String(), 3000))
	}
	pid, _ := strconv.Atoi(m[len(m)-1][1])
	return pid
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
