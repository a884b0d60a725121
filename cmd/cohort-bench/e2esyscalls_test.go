package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCountTrace: strace's lines are counted by call, a call split into
// "unfinished" and "resumed" once, signals by name.
func TestCountTrace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "trace")
	os.WriteFile(p, []byte(`12 read(3,  <unfinished ...>
13 futex(0x1, FUTEX_WAKE_PRIVATE, 1) = 1
12 <... read resumed>"x", 9) = 1
12 read(3, 0x1, 9) = -1 EAGAIN (Resource temporarily unavailable)
12 --- SIGURG {si_signo=SIGURG, si_code=SI_TKILL, si_pid=1, si_uid=0} ---
12 rt_sigreturn({mask=[]}) = 0
13 +++ exited with 0 +++
`), 0o600)
	n, err := countTrace(p)
	if err != nil || n["read"] != 2 || n["futex"] != 1 || n["SIGURG"] != 1 || n["rt_sigreturn"] != 1 || len(n) != 4 {
		t.Fatalf("%v %v", n, err)
	}
}

// TestGVisorTraceCount: runsc's --strace lines after the mark are counted
// by the role of their task, known from its execve (before the mark too);
// exits (X) and other tasks are not counted.
func TestGVisorTraceCount(t *testing.T) {
	dir := t.TempDir()
	head := `I1129 14:39:25.174373   17272 strace.go:605] [   9:   9] init X execve(0x2b28 /run/cohort/bin/cohort, 0x2b29 ["/run/cohort/bin/cohort", "intern", "--listen-fd", "3"], 0x1 []) = 0 (0x0) (1ms)
I1129 14:39:25.303545   17272 strace.go:605] [  15:  15] cohort X execve(0x873c /run/cohort/bin/cohort, 0x873d ["/run/cohort/bin/cohort", "agent"], 0x1 []) = 0 (0x0) (1ms)
I1129 14:39:25.303546   17272 strace.go:561] [   9:  10] cohort E read(0x3, 0x1, 0x9)
`
	tail := `I1129 14:39:26.000001   17272 strace.go:561] [   9:  11] cohort E read(0x3, 0x1, 0x9)
I1129 14:39:26.000002   17272 strace.go:599] [   9:  11] cohort X read(0x3, 0x1, 0x9) = 9 (0x9) (3µs)
I1129 14:39:26.000003   17272 strace.go:561] [  15:  15] cohort E write(0x1, 0x1, 0xf8)
I1129 14:39:26.000004   17272 strace.go:561] [  15:  16] cohort E futex(0x1, FUTEX_WAKE, 0x1)
I1129 14:39:26.000005   17272 strace.go:561] [   1:   1] init E wait4(0x9, 0x1, 0x0, 0x0)
`
	p := filepath.Join(dir, "runsc.log.20261129-143920.956709.boot.txt")
	os.WriteFile(p, []byte(head), 0o600)
	g := &gvisorTrace{dir: dir}
	m, err := g.mark()
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(tail)
	f.Close()
	n, err := g.count(m)
	if err != nil || n["daemon"]["read"] != 1 || len(n["daemon"]) != 1 || n["agent"]["write"] != 1 || n["agent"]["futex"] != 1 || len(n["agent"]) != 2 {
		t.Fatalf("%v %v", n, err)
	}
}
