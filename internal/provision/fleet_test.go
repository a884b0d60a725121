package provision_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/provisiontest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// localEnv is a gateway over db with a local provisioner (chat going
// through it), its daemons jailed or not; tune adjusts the provisioner
// before anything starts. It does not start the provisioner.
func localEnv(t testing.TB, db *bun.DB, jailed bool, tune func(*provision.Provisioner)) (*testenv.Env, *provision.Provisioner) {
	t.Helper()
	bin := provisiontest.InternBinary(t)
	dataDir := t.TempDir()
	var prov *provision.Provisioner
	e := testenv.New(t, db, func(s *server.Server) {
		prov = &provision.Provisioner{DB: db, KEK: s.KEK, Log: s.Log, RestartBackoff: 100 * time.Millisecond,
			Backend: &localjail.Backend{DataDir: dataDir, Command: []string{bin}}}
		if tune != nil {
			tune(prov)
		}
		s.Provisioner, s.Interns.Lifecycle, s.Chat.Daemons = prov, prov, prov
	})
	t.Cleanup(prov.Close)
	t.Cleanup(func() {
		if t.Failed() {
			l := e.Logs()
			t.Logf("gateway log (tail):\n%s", l[max(0, len(l)-6000):])
		}
	})
	if jailed {
		relay, err := egress.New(egress.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { relay.Close() })
		local(prov).Jail = &localjail.JailConfig{Relay: relay, Hide: localjail.HiddenPaths(dataDir)}
		if err := local(prov).ProbeJail(); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatal(err)
			}
			t.Skipf("SKIPPING: %v", err)
		}
	}
	return e, prov
}

// fleetEnv is localEnv, unjailed, started.
func fleetEnv(t *testing.T, db *bun.DB, tune func(*provision.Provisioner)) (*testenv.Env, *provision.Provisioner) {
	t.Helper()
	e, prov := localEnv(t, db, false, tune)
	if err := prov.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e, prov
}

// cli is the operator's CLI: it changes rows without telling any gateway.
func cli(db *bun.DB) *interns.Service { return &interns.Service{DB: db} }

func state(t *testing.T, db *bun.DB, id string) string { return loadIntern(t, db, id).State }

// Changes made by another process (the CLI) reach the gateway without a
// restart: by PostgreSQL notification (the sweep is an hour here, so only a
// notification can do it) or, on SQLite, by the sweep.
func TestReconcilerFollowsTheDatabase(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		sweep := time.Hour
		if db.Dialect().Name().String() != "pg" {
			sweep = 200 * time.Millisecond
		}
		e, prov := fleetEnv(t, db, func(p *provision.Provisioner) { p.Sweep = sweep })
		ctx := context.Background()
		testutil.Eventually(t, provisiontest.WaitLimit, "the bootstrap intern runs", func() bool { return state(t, db, e.InternID) == store.InternRunning })

		created, err := cli(db).Create(ctx, e.Operator(), &cohortv1.CreateInternRequest{WorkspaceId: e.WorkspaceID, Name: "from-cli"})
		if err != nil {
			t.Fatal(err)
		}
		id := created.GetId()
		testutil.Eventually(t, provisiontest.WaitLimit, "the CLI's intern runs", func() bool { return state(t, db, id) == store.InternRunning && local(prov).DaemonPID(id) != 0 })

		pid := local(prov).DaemonPID(id)
		if _, err := cli(db).Suspend(ctx, e.Operator(), id); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, provisiontest.WaitLimit, "the suspended intern's daemon stops", func() bool { return local(prov).DaemonPID(id) == 0 && !alive(pid) })

		if _, err := cli(db).Resume(ctx, e.Operator(), id); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, provisiontest.WaitLimit, "the resumed intern runs", func() bool { return state(t, db, id) == store.InternRunning && local(prov).DaemonPID(id) != 0 })

		// Suspended and resumed before the gateway looks: nothing to stop,
		// and the row must not stay provisioning (it used to, for good).
		if _, err := cli(db).Suspend(ctx, e.Operator(), id); err != nil {
			t.Fatal(err)
		}
		if _, err := cli(db).Resume(ctx, e.Operator(), id); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, provisiontest.WaitLimit, "the intern resumed at once runs", func() bool { return state(t, db, id) == store.InternRunning && local(prov).DaemonPID(id) != 0 })

		pid = local(prov).DaemonPID(id)
		if _, err := cli(db).Delete(ctx, e.Operator(), id); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, provisiontest.WaitLimit, "the deleted intern's daemon and directory go", func() bool {
			_, err := os.Stat(filepath.Join(local(prov).DataDir, "interns", id))
			return local(prov).DaemonPID(id) == 0 && !alive(pid) && os.IsNotExist(err)
		})
	})
}

// chatTurn runs one turn through the gateway's REST door and returns the
// stream.
func chatTurn(t *testing.T, e *testenv.Env, id, body string) string {
	t.Helper()
	status, out, _ := e.Do(t, "POST", "/interns/"+id+"/chat/completions", e.WorkspaceKey, "application/json", body)
	if status != 200 {
		t.Fatalf("chat: %d %s", status, out)
	}
	return out
}

var sessionRE = regexp.MustCompile(`"session_id":"([^"]+)"`)
var callRE = regexp.MustCompile(`"tool_calls":\[\{"index":0,"id":"([^"]+)"`)

// An idle intern sleeps: its processes end, its sessions stay. The next
// turn wakes it and the session goes on; a paused run keeps it awake until
// answered.
func TestSleepAndWake(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e, prov := fleetEnv(t, db, func(p *provision.Provisioner) {
			p.IdleTimeout = 300 * time.Millisecond
			p.Sweep = 100 * time.Millisecond
		})
		id := e.InternID
		testutil.Eventually(t, provisiontest.WaitLimit, "running", func() bool { return state(t, db, id) == store.InternRunning })
		out := chatTurn(t, e, id, `{"stream":true,"messages":[{"role":"user","content":"remember me"}]}`)
		m := sessionRE.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no session: %s", out)
		}
		session := m[1]
		pid := local(prov).DaemonPID(id)
		testutil.Eventually(t, provisiontest.WaitLimit, "asleep", func() bool {
			return state(t, db, id) == store.InternSleeping && local(prov).DaemonPID(id) == 0 && !alive(pid)
		})
		if _, err := os.Stat(filepath.Join(local(prov).DataDir, "interns", id, "sessions")); err != nil {
			t.Fatalf("the sessions went with the jail: %v", err)
		}
		if p := interns.Proto(loadIntern(t, db, id)); p.GetState() != "sleeping" {
			t.Fatalf("API state %q", p.GetState())
		}

		// The next turn, in the same session, wakes it.
		out = chatTurn(t, e, id, `{"stream":true,"session_id":"`+session+`","messages":[{"role":"user","content":"back again"}]}`)
		if !strings.Contains(out, "back again") || !strings.Contains(out, `"session_id":"`+session+`"`) || !strings.Contains(out, "[DONE]") {
			t.Fatalf("turn to a sleeping intern: %s", out)
		}
		if state(t, db, id) != store.InternRunning || local(prov).DaemonPID(id) == 0 {
			t.Fatal("not awake after the turn")
		}

		// A paused run holds it awake past many idle timeouts; the reply
		// ends the run and then it may sleep.
		out = chatTurn(t, e, id, `{"stream":true,"approval_mode":"manual","messages":[{"role":"user","content":"$ echo held"}]}`)
		call := callRE.FindStringSubmatch(out)
		m = sessionRE.FindStringSubmatch(out)
		if call == nil || m == nil {
			t.Fatalf("no pause: %s", out)
		}
		pid = local(prov).DaemonPID(id)
		time.Sleep(1500 * time.Millisecond) // five idle timeouts
		if state(t, db, id) != store.InternRunning || local(prov).DaemonPID(id) != pid {
			t.Fatalf("an intern with a paused run slept (state %s)", state(t, db, id))
		}
		out = chatTurn(t, e, id, `{"stream":true,"session_id":"`+m[1]+`","messages":[{"role":"tool","tool_call_id":"`+call[1]+`","content":"allow_once"}]}`)
		if !strings.Contains(out, "held") {
			t.Fatalf("the reply did not finish the run: %s", out)
		}
		testutil.Eventually(t, provisiontest.WaitLimit, "asleep after the run", func() bool { return state(t, db, id) == store.InternSleeping })

		// Concurrent turns to the sleeping intern wake it once.
		before := strings.Count(e.Logs(), "intern daemon running")
		var wg sync.WaitGroup
		errs := make(chan string, 5)
		for i := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, out, _ := e.Do(t, "POST", "/interns/"+id+"/chat/completions", e.WorkspaceKey, "application/json",
					fmt.Sprintf(`{"stream":true,"messages":[{"role":"user","content":"together %d"}]}`, i))
				if status != 200 || !strings.Contains(out, "[DONE]") {
					errs <- fmt.Sprintf("%d %s", status, out)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for s := range errs {
			t.Errorf("concurrent wake: %s", s)
		}
		if n := strings.Count(e.Logs(), "intern daemon running") - before; n != 1 {
			t.Errorf("five concurrent turns started %d daemons", n)
		}
	})
}

// At --max-awake-interns, waking another puts the least recently used idle
// intern to sleep; with every awake intern busy the wake is refused 503
// busy.
func TestMaxAwakeEvictsTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	db := storetest.SQLite(t)
	e, prov := fleetEnv(t, db, func(p *provision.Provisioner) { p.MaxAwake = 2; p.Sweep = 100 * time.Millisecond })
	ctx := context.Background()
	a := e.InternID
	mk := func(name string) string {
		c, err := e.Server.Interns.Create(ctx, e.Operator(), &cohortv1.CreateInternRequest{WorkspaceId: e.WorkspaceID, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return c.GetId()
	}
	b := mk("b")
	testutil.Eventually(t, provisiontest.WaitLimit, "two awake", func() bool { return state(t, db, a) == store.InternRunning && state(t, db, b) == store.InternRunning })
	chatTurn(t, e, a, `{"stream":true,"messages":[{"role":"user","content":"a is used last"}]}`)

	c := mk("c")
	// c is provisioning; the turn wakes it, putting b (used longest ago) to sleep.
	out := chatTurn(t, e, c, `{"stream":true,"messages":[{"role":"user","content":"hello c"}]}`)
	if !strings.Contains(out, "hello c") {
		t.Fatalf("turn to c: %s", out)
	}
	if state(t, db, b) != store.InternSleeping || state(t, db, a) != store.InternRunning || state(t, db, c) != store.InternRunning {
		t.Fatalf("states a %s b %s c %s", state(t, db, a), state(t, db, b), state(t, db, c))
	}

	// a and c each hold a paused run: nothing can sleep, so b's wake is refused.
	for _, id := range []string{a, c} {
		chatTurn(t, e, id, `{"stream":true,"approval_mode":"manual","messages":[{"role":"user","content":"$ true"}]}`)
	}
	status, body, h := e.Do(t, "POST", "/interns/"+b+"/chat/completions", e.WorkspaceKey, "application/json",
		`{"stream":true,"messages":[{"role":"user","content":"hello b"}]}`)
	if status != 503 || !strings.Contains(body, `"reason":"busy"`) {
		t.Fatalf("wake at the cap with every intern busy: %d %s", status, body)
	}
	if h.Get("Retry-After") != strconv.Itoa(apierr.RetryNoRoom) {
		t.Fatalf("wake at the cap: Retry-After %q", h.Get("Retry-After"))
	}
	if state(t, db, b) != store.InternSleeping {
		t.Fatalf("the refused wake changed b: %s", state(t, db, b))
	}
	_, err := prov.Wake(ctx, loadIntern(t, db, b))
	if !apierr.Is(err, 503, "busy") {
		t.Fatalf("Wake: %v", err)
	}
}

// sleepingIntern is a fleet whose demo intern ran once and was put to
// sleep: the next turn wakes it.
func sleepingIntern(t *testing.T) (*bun.DB, *testenv.Env, *provision.Provisioner, string) {
	t.Helper()
	db := storetest.SQLite(t)
	e, prov := fleetEnv(t, db, func(p *provision.Provisioner) {
		p.IdleTimeout = time.Hour
	})
	id := e.InternID
	testutil.Eventually(t, provisiontest.WaitLimit, "running", func() bool { return state(t, db, id) == store.InternRunning })
	if _, err := db.NewUpdate().Model((*store.Intern)(nil)).Set("state = ?", store.InternSleeping).Where("id = ?", id).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, provisiontest.WaitLimit, "asleep", func() bool { return local(prov).DaemonPID(id) == 0 })
	return db, e, prov, id
}

// A wake whose agent cannot start is the spec's unreachable intern, and
// the intern sleeps again, so the next wake starts afresh.
func TestFailedWakeDoesNotWedge(t *testing.T) {
	t.Parallel()
	db, e, prov, id := sleepingIntern(t)
	// Break the intern: a file where its directory was.
	dir := filepath.Join(local(prov).DataDir, "interns", id)
	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(dir, []byte("not a directory"), 0o600)
	status, body, _ := e.Do(t, "POST", "/interns/"+id+"/chat/completions", e.WorkspaceKey, "application/json",
		`{"stream":true,"messages":[{"role":"user","content":"wake up"}]}`)
	if status != 502 || !strings.Contains(body, `"reason":"intern_unreachable"`) {
		t.Fatalf("failed wake: %d %s", status, body)
	}
	if !strings.Contains(e.Logs(), "not a directory") {
		t.Errorf("the failed wake's cause was not logged:\n%s", e.Logs())
	}
	if state(t, db, id) != store.InternSleeping {
		t.Fatalf("after a failed wake: %s", state(t, db, id))
	}
	os.Remove(dir)
	if err := os.Rename(dir+".away", dir); err != nil {
		t.Fatal(err)
	}
	out := chatTurn(t, e, id, `{"stream":true,"messages":[{"role":"user","content":"wake up again"}]}`)
	if !strings.Contains(out, "wake up again") {
		t.Fatalf("the next wake: %s", out)
	}
}

// TestWakeRefusedAgentSaysWhy: an intern whose agent the operator removed
// from the catalog cannot be woken, and the caller is told why (issue 29),
// not only the log.
func TestWakeRefusedAgentSaysWhy(t *testing.T) {
	t.Parallel()
	db, e, _, id := sleepingIntern(t)
	ctx := context.Background()
	// Created under an earlier catalog that held this agent.
	if _, err := db.NewUpdate().Model((*store.Intern)(nil)).Set("agent = ?", "retired-agent").Where("id = ?", id).Exec(ctx); err != nil {
		t.Fatal(err)
	}
	status, body, _ := e.Do(t, "POST", "/interns/"+id+"/chat/completions", e.WorkspaceKey, "application/json",
		`{"stream":true,"messages":[{"role":"user","content":"wake up"}]}`)
	if status != 502 || !strings.Contains(body, `"reason":"intern_unreachable"`) ||
		!strings.Contains(body, `retired-agent`) || !strings.Contains(body, "no longer allowed by the operator") {
		t.Fatalf("wake of a retired agent: %d %s", status, body)
	}
}
