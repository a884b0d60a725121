package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// `cohort serve` runs its local interns from the cohort-intern beside it
// (the layout the image and README install): the jail's init is that
// binary. A cohort-intern of another build beside it is refused with a
// warning, and the interns run from cohort itself; turns work either way.
func TestGatewayChoosesTheInternBinary(t *testing.T) {
	t.Parallel()
	shipped := filepath.Dir(cohortBin)
	stale := t.TempDir()
	copyFile(t, cohortBin, filepath.Join(stale, "cohort"))
	if err := os.WriteFile(filepath.Join(stale, "cohort-intern"), []byte("#!/bin/sh\necho 'cohort v0.0.1 commit 0123abc go1.20'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, runs, log string
	}{
		{name: "same build beside", dir: shipped, runs: "cohort-intern", log: `"msg":"interns run from their own binary"`},
		{name: "another build beside", dir: stale, runs: "cohort", log: `"level":"WARN","msg":"interns run from the gateway's own binary instead of --intern-binary`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cmd := testCommand(filepath.Join(tc.dir, "cohort"), dir, "COHORT_JAIL_ORPHAN_TIMEOUT=0", "serve", "--listen", "127.0.0.1:0")
			gw := startCmd(t, "gateway", cmd)
			if !strings.Contains(gw.stderr.String(), tc.log) {
				t.Fatalf("the gateway's log lacks %s:\n%s", tc.log, tail(gw.stderr.String(), 3000))
			}
			b, err := os.ReadFile(filepath.Join(dir, ".cohort", "bootstrap.json"))
			if err != nil {
				t.Fatal(err)
			}
			var boot map[string]string
			if err := json.Unmarshal(b, &boot); err != nil {
				t.Fatal(err)
			}
			var s *stream
			testutil.Eventually(t, wait, "the demo intern answers", func() bool {
				res := chat(t, gw, boot["workspace_key"], boot["intern_id"], user("Hello there"))
				if res.StatusCode != 200 {
					res.Body.Close()
					return false
				}
				s = readAll(t, res)
				return true
			})
			if !strings.Contains(s.Text, "Hello there") || s.Finish != "stop" {
				t.Fatalf("turn: %q %q", s.Finish, s.Text)
			}
			want, err := os.ReadFile(filepath.Join(tc.dir, tc.runs))
			if err != nil {
				t.Fatal(err)
			}
			inits := childrenNamed(t, gw.cmd.Process.Pid, "cohort-jail-init")
			if len(inits) != 1 {
				t.Fatalf("the gateway's jail inits: %v", inits)
			}
			got, err := os.ReadFile(fmt.Sprintf("/proc/%d/exe", inits[0]))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("the jail's init does not run %s", tc.runs)
			}
		})
	}
}

// testCommand is cohort at bin run in dir with env, as startIn runs it.
func testCommand(bin, dir string, env string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), env)
	return cmd
}

// childrenNamed are the child processes of pid whose argv[0] is name.
func childrenNamed(t *testing.T, pid int, name string) []int {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(f)
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n))
			if argv0, _, _ := bytes.Cut(cmdline, []byte{0}); string(argv0) == name {
				out = append(out, n)
			}
		}
	}
	return out
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}
