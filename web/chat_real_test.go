package web_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

var build struct {
	sync.Once
	dir, bin string
	err      error
	out      []byte
}

// cohortBinary builds the real cohort command once per test run: the local
// provisioner starts it as each intern's daemon, which runs the built-in
// agent.
func cohortBinary(t *testing.T) string {
	t.Helper()
	build.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "cohort-web-bin-")
		if build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "cohort")
		build.out, build.err = exec.Command("go", "build", "-o", build.bin, "github.com/cohort-dev/cohort/cmd/cohort").CombinedOutput()
	})
	if build.err != nil {
		t.Fatalf("go build: %v\n%s", build.err, build.out)
	}
	return build.bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	os.Exit(code)
}

// demoEnv is a gateway whose interns run the real daemon (local
// provisioner) and built-in agent; it returns once the demo intern, on
// the offline cohort/demo model, is running.
func demoEnv(t *testing.T) *testenv.Env {
	t.Helper()
	bin := cohortBinary(t)
	var prov *provision.Provisioner
	e := testenv.New(t, storetest.SQLite(t), func(s *server.Server) {
		prov = &provision.Provisioner{DB: s.DB, KEK: s.KEK, Log: s.Log, Backend: &localjail.Backend{DataDir: t.TempDir(), Command: []string{bin}}}
		s.Provisioner, s.Interns.Lifecycle, s.Chat.Daemons = prov, prov, prov
	})
	t.Cleanup(prov.Close)
	ctx := context.Background()
	if err := prov.Start(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(45 * time.Second)
	for {
		var in store.Intern
		if err := e.DB.NewSelect().Model(&in).Where("id = ?", e.InternID).Scan(ctx); err != nil {
			t.Fatal(err)
		}
		if in.State == store.InternRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo intern is %s, not running", in.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return e
}

// TestChatPermissionPause runs the playground end to end: gateway, the
// intern's real daemon (local provisioner) and the built-in agent with the
// offline cohort/demo model. "$ echo hi" in manual mode pauses for
// permission; the page offers exactly the four option kinds and cancel;
// "Allow once" resumes the same run, which runs the command and finishes.
// A question then becomes a form whose answer the agent uses.
func TestChatPermissionPause(t *testing.T) {
	t.Parallel()
	e := demoEnv(t)

	b := browsertest.New(t, 390, 844)
	signIn(t, b, e.HTTP.URL+"/", e.WorkspaceKey)
	b.Do(t,
		chromedp.Navigate(e.HTTP.URL+"/#/chat/"+e.InternID),
		chromedp.WaitReady(css("#chat-intern option[value='"+e.InternID+"']")),
		chromedp.Click(css("#mode-manual")),
		chromedp.SendKeys(css("#prompt"), "$ echo hi"),
		chromedp.Click(css("#send")),
		chromedp.WaitVisible(css(".pause.permission button[data-kind=allow_once]")),
	)
	kinds := browsertest.Get(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll(".pause button")].map(b => b.dataset.kind)`))
	if strings.Join(kinds, ",") != "allow_once,allow_always,reject_once,reject_always,cancel" {
		t.Fatalf("pause buttons %v", kinds)
	}
	if r := b.Text(t, ".turn .reasoning"); !strings.Contains(r, "shell command") {
		t.Fatalf("reasoning %q", r)
	}
	if op := b.Text(t, ".pause p"); op != "The intern asks to use shell." {
		t.Fatalf("operation line %q", op)
	}
	// The caller sees the command it approves, and cannot send a new
	// prompt while the run waits for the answer.
	if in := b.Text(t, ".pause pre.pause-input"); in != "echo hi" {
		t.Fatalf("the pause shows %q as the command", in)
	}
	if !browsertest.Get(t, b, chromedp.Evaluate[bool](`document.getElementById("send").disabled`)) {
		t.Fatal("Send is enabled while the run waits for an answer")
	}
	session := browsertest.Get(t, b, chromedp.Value(css("#session")))
	if session == "" || b.Text(t, ".turn .session-id") != session {
		t.Fatalf("session %q not shown", session)
	}
	fitsPhone(t, b, "paused playground")
	screenshot(t, b, "console-playground.png")
	b.Do(t, chromedp.Click(css(".pause button[data-kind=allow_once]")))
	until(t, b, `document.getElementById("chat-status").textContent === "Finished." && !document.getElementById("send").disabled`)
	turn := b.Text(t, ".turn")
	if !contains(turn, "Answered: Allow once", "Shell result:", "hi", "Finish\nstop", "tokens") {
		t.Fatalf("turn after allow once:\n%s", turn)
	}
	if m := b.Text(t, ".turn .models"); m != "cohort/demo" {
		t.Fatalf("models %q", m)
	}
	if s := browsertest.Get(t, b, chromedp.Value(css("#session"))); s != session {
		t.Fatalf("the answer moved the session from %q to %q", session, s)
	}
	// A question in the same session: the agent's form, answered and used.
	b.Do(t,
		chromedp.SendKeys(css("#prompt"), "is it done?"),
		chromedp.Click(css("#send")),
		chromedp.WaitVisible(css(".turn:nth-child(2) .pause.question input[name=answer]")),
		chromedp.SendKeys(css(".pause.question input[name=answer]"), "yes"),
		chromedp.Click(css(".pause.question button[data-action=accept]")),
	)
	until(t, b, `document.querySelectorAll(".turn").length === 2 && document.getElementById("chat-status").textContent === "Finished."`)
	if c := b.Text(t, ".turn:nth-child(2)"); !contains(c, "Answered: Accepted", "You answered: yes", session) {
		t.Fatalf("question turn:\n%s", c)
	}
	b.NoErrors(t)
}
