package provision_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/provisiontest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// A jailed intern run from cohort-intern (the binary beside the gateway's,
// as they ship) is that binary throughout: the jail's init, the daemon and
// the built-in agent; and a turn works.
func TestLocalInternRunsSmallBinary(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e, prov := localEnv(t, db, true, nil)
		if err := prov.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		id := e.InternID
		testutil.Eventually(t, provisiontest.WaitLimit, "running", func() bool { return loadIntern(t, db, id).State == store.InternRunning })
		small := fileSum(t, provisiontest.InternBinary(t))
		// The first turn waits for the agent to be up.
		if out := chatTurn(t, e, id, `{"stream":true,"messages":[{"role":"user","content":"hello small"}]}`); !strings.Contains(out, "[DONE]") {
			t.Fatalf("turn: %s", out)
		}
		init := local(prov).DaemonPID(id)
		daemon := onlyChild(t, init)
		agent := onlyChild(t, daemon)
		for name, pid := range map[string]int{"init": init, "daemon": daemon, "agent": agent} {
			// The jail shows the binary through an overlay (another inode):
			// compare what runs.
			if fileSum(t, fmt.Sprintf("/proc/%d/exe", pid)) != small {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				t.Fatalf("the %s (pid %d, %q) does not run %s", name, pid, cmdline, provisiontest.InternBinary(t))
			}
		}
	})
}

// fileSum is the SHA-256 of a file's content.
func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// onlyChild is the one child process of pid (of any of its threads).
func onlyChild(t *testing.T, pid int) int {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var kids []string
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		if err == nil {
			kids = append(kids, strings.Fields(string(b))...)
		}
	}
	if len(kids) != 1 {
		t.Fatalf("pid %d has children %q, want one", pid, kids)
	}
	n, err := strconv.Atoi(kids[0])
	if err != nil {
		t.Fatal(err)
	}
	return n
}
