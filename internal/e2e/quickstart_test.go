package e2e_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// The README's quick start as a new user runs it: `cohort serve` with no
// flags in a fresh directory (the data directory is the relative
// ./.cohort), one turn with the demo intern, then a manual-mode shell
// command that pauses, is allowed once, and finishes sandboxed, the
// intern jailed throughout.
func TestQuickStart(t *testing.T) {
	t.Parallel()
	gw, wk, in := quickStart(t)
	p := readAll(t, chat(t, gw, wk, in, user("$ echo hello from the sandbox", `"approval_mode":"manual"`)))
	if p.Finish != "tool_calls" {
		t.Fatalf("no pause: %q %s", p.Finish, p.Text)
	}
	r := readAll(t, chat(t, gw, wk, in, p.answer("allow_once")))
	if r.Finish != "stop" || !strings.Contains(r.Text, "hello from the sandbox") || !strings.Contains(r.Text, `"sandboxed":true`) {
		t.Fatalf("after allow_once: %q %q", r.Finish, r.Text)
	}
	if strings.Contains(gw.stderr.String(), "intern daemon stopped") {
		t.Errorf("the intern's daemon failed on the way:\n%s", tail(gw.stderr.String(), 3000))
	}
}

// quickStart is the quick start's gateway (with further serve flags:
// another backend) and its first turn with the demo intern.
func quickStart(t *testing.T, serveArgs ...string) (gw *proc, wk, in string) {
	dir := t.TempDir()
	// The README's command; only the jail's orphan timeout is 0, so that
	// the intern's jail ends with this test's gateway instead of waiting
	// ten minutes for another.
	gw = startIn(t, dir, "gateway", []string{"COHORT_JAIL_ORPHAN_TIMEOUT=0"}, append([]string{"serve", "--listen", "127.0.0.1:0"}, serveArgs...)...)
	b, err := os.ReadFile(filepath.Join(dir, ".cohort", "bootstrap.json"))
	if err != nil {
		t.Fatal(err)
	}
	var boot map[string]string
	if err := json.Unmarshal(b, &boot); err != nil {
		t.Fatal(err)
	}
	wk, in = boot["workspace_key"], boot["intern_id"]
	var s *stream
	testutil.Eventually(t, wait, "the demo intern answers", func() bool {
		res := chat(t, gw, wk, in, user("Hello there"))
		if res.StatusCode != 200 {
			res.Body.Close()
			return false
		}
		s = readAll(t, res)
		return true
	})
	if !strings.Contains(s.Text, "Hello there") || s.Finish != "stop" {
		t.Fatalf("first turn: %q %q", s.Finish, s.Text)
	}
	return gw, wk, in
}
