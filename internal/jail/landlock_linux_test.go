package jail_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/jail"
)

// TestStartFilteredIsolates: a program started under the strict filter
// cannot open its starter's /proc entries that need ptrace access (memory
// for reading and for writing, descriptors, working directory), nor a
// sibling's, even with the same user and, here, as root with
// CAP_SYS_PTRACE; its starter still reads its entries. Without the
// Landlock domain every open below succeeds. (environ is not among them:
// this kernel lets a domain read it; the daemon is non-dumpable and keeps
// no secret there.)
func TestStartFilteredIsolates(t *testing.T) {
	if jail.LandlockABI() < 1 {
		t.Skip("no Landlock in this kernel")
	}
	sibling := exec.Command("sleep", "30")
	if err := jail.StartFiltered(sibling, jail.SeccompStrict); err != nil {
		t.Fatal(err)
	}
	defer func() { sibling.Process.Kill(); sibling.Wait() }()
	probe := func(pid int) string {
		return fmt.Sprintf(`(exec 3</proc/%[1]d/mem) 2>/dev/null && echo read-mem; (exec 3<>/proc/%[1]d/mem) 2>/dev/null && echo write-mem;`+
			` readlink /proc/%[1]d/fd/0 >/dev/null 2>&1 && echo follow-fd; readlink /proc/%[1]d/cwd >/dev/null 2>&1 && echo follow-cwd; echo probed`, pid)
	}
	for name, pid := range map[string]int{"starter": os.Getpid(), "sibling": sibling.Process.Pid} {
		cmd := exec.Command("sh", "-c", probe(pid))
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := jail.StartFiltered(cmd, jail.SeccompStrict); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		if got := strings.TrimSpace(out.String()); got != "probed" {
			t.Errorf("%s: a filtered program reached its %s's /proc entries: %q", name, name, got)
		}
	}
	// The starter keeps its view of what it started.
	if _, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", sibling.Process.Pid)); err != nil {
		t.Errorf("the starter cannot follow its program's cwd: %v", err)
	}
}

// TestStartFilteredSignalsSiblings: a later command can stop what an
// earlier one left running (`pkill -f vite`), though neither can open the
// other's /proc entries (ADR 0044: why Landlock's signal scope is not used).
func TestStartFilteredSignalsSiblings(t *testing.T) {
	if jail.LandlockABI() < 1 {
		t.Skip("no Landlock in this kernel")
	}
	server := exec.Command("sleep", "30")
	if err := jail.StartFiltered(server, jail.SeccompStrict); err != nil {
		t.Fatal(err)
	}
	defer func() { server.Process.Kill(); server.Wait() }()
	stop := exec.Command("sh", "-c", fmt.Sprintf("kill -TERM %d && echo stopped", server.Process.Pid))
	var out strings.Builder
	stop.Stdout, stop.Stderr = &out, &out
	if err := jail.StartFiltered(stop, jail.SeccompStrict); err != nil {
		t.Fatal(err)
	}
	stop.Wait()
	if strings.TrimSpace(out.String()) != "stopped" {
		t.Fatalf("a later command could not stop an earlier one: %q", out.String())
	}
	if err := server.Wait(); err == nil {
		t.Fatal("the earlier command was not stopped")
	}
}
