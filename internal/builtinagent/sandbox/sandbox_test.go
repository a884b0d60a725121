package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/builtinagent/sandbox"
)

// needSandbox skips loudly when namespaces are not available: the confined tests are
// the point of this package.
func needSandbox(t *testing.T) {
	t.Helper()
	if !sandbox.Available() {
		t.Skip("SKIPPING SANDBOX TEST: this machine cannot make namespaces")
	}
}

func TestConfined(t *testing.T) {
	needSandbox(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "seed"), []byte("seed\n"), 0o644)
	outside := t.TempDir()
	cases := []struct {
		name    string
		command string
		want    string
		exit    int
	}{
		{"work dir read-only", "touch f 2>/dev/null || echo refused", "refused\n", 0},
		{"work dir readable", "cat seed", "seed\n", 0},
		{"root read-only", "touch " + filepath.Join(outside, "x") + " 2>/dev/null || echo refused", "refused\n", 0},
		{"etc read-only", "touch /etc/cohort-sandbox-probe 2>/dev/null || echo refused", "refused\n", 0},
		{"private tmp", "echo t > /tmp/probe && cat /tmp/probe", "t\n", 0},
		{"only loopback", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", "lo\n", 0},
		{"own pid namespace", "tr '\\0' ' ' < /proc/1/cmdline", "cohort-jail-init ", 0},
		{"exit status", "exit 3", "", 3},
		{"cwd is work dir", "pwd", dir + "\n", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := sandbox.Run(context.Background(), sandbox.Spec{Command: c.command, Dir: dir, Confined: true})
			if err != nil {
				t.Fatal(err)
			}
			if res.Output != c.want || res.ExitCode != c.exit || !res.Confined {
				t.Fatalf("got %q exit %d confined %v, want %q exit %d", res.Output, res.ExitCode, res.Confined, c.want, c.exit)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
		t.Fatal("confined command wrote outside its work directory")
	}
	if _, err := os.Stat("/tmp/probe"); err == nil {
		t.Fatal("confined command wrote the host's /tmp")
	}
}

func TestUnconfinedWritesAnywhere(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	res, err := sandbox.Run(context.Background(), sandbox.Spec{Command: "echo x > " + filepath.Join(outside, "x") + " && echo ok", Dir: dir})
	if err != nil || res.Output != "ok\n" || res.Confined {
		t.Fatalf("%+v %v", res, err)
	}
}

// A jail that cannot be made (here: its work directory cannot be bound)
// fails the run; the command never runs unconfined.
func TestUnbuildableJailFailsClosed(t *testing.T) {
	needSandbox(t)
	parent := t.TempDir()
	marker := filepath.Join(parent, "ran")
	_, err := sandbox.Run(context.Background(), sandbox.Spec{Command: "touch " + marker, Dir: filepath.Join(parent, "missing"), Confined: true})
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("command ran without its sandbox")
	}
}

func TestOutputBound(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name      string
		n         int
		truncated bool
	}{{"at bound", 1000, false}, {"past bound", 1001, true}} {
		t.Run(c.name, func(t *testing.T) {
			res, err := sandbox.Run(context.Background(), sandbox.Spec{
				Command: "head -c " + strconv.Itoa(c.n) + " /dev/zero | tr '\\0' a", Dir: dir, MaxOutput: 1000,
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Output) != 1000 || res.TotalBytes != int64(c.n) || res.Truncated != c.truncated {
				t.Fatalf("len %d total %d truncated %v", len(res.Output), res.TotalBytes, res.Truncated)
			}
		})
	}
}

func TestTimeoutKillsProcessGroup(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	res, err := sandbox.Run(context.Background(), sandbox.Spec{Command: "sleep 30 & sleep 30; echo never", Dir: dir, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || strings.Contains(res.Output, "never") || time.Since(start) > 10*time.Second {
		t.Fatalf("%+v after %v", res, time.Since(start))
	}
}

func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := sandbox.Run(ctx, sandbox.Spec{Command: "sleep 30", Dir: t.TempDir()})
	if err != context.Canceled {
		t.Fatalf("err = %v", err)
	}
}

func TestEnvironScrubsCredentials(t *testing.T) {
	got := sandbox.Environ([]string{"PATH=/bin", "OPENAI_API_KEY=sk-1", "COHORT_AGENT_API_KEY=sk-2", "GITHUB_TOKEN=t", "DB_PASSWORD=p", "HOME=/root", "COHORT_AGENT_MODEL=m"})
	if strings.Join(got, ",") != "PATH=/bin,HOME=/root" {
		t.Fatalf("got %v", got)
	}
}

// Whatever the model runs, direct or confined, is under the strict syscall
// filter: no user namespace (which would give it uid 0 and mount rights in
// its own), no ptrace.
func TestCommandsAreFiltered(t *testing.T) {
	for _, confined := range []bool{false, true} {
		if confined {
			needSandbox(t)
		}
		for _, c := range []string{"unshare -Ur id -u", "unshare -m true", "strace -f -o /dev/null true"} {
			if strings.HasPrefix(c, "strace") && !haveCommand("strace") {
				continue
			}
			res, err := sandbox.Run(context.Background(), sandbox.Spec{Command: c + " 2>&1; echo status=$?", Dir: t.TempDir(), Confined: confined})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(res.Output, "status=0") || !strings.Contains(res.Output, "ermitted") {
				t.Errorf("confined=%v: %s: %q, want refused (Operation not permitted)", confined, c, res.Output)
			}
		}
	}
}

func haveCommand(name string) bool {
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return true
		}
	}
	return false
}
