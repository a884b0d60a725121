package jail_test

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/jail"
)

// BenchmarkJailStart: from Start to the program's first byte of output,
// with each seccomp level, in both kinds of jail (a dedicated uid: the
// filter goes on the init's thread; a user namespace: through the shim).
// The levels take turns within each iteration, so a busy machine weighs on
// all of them alike.
//
//	go test ./internal/jail -run '^$' -bench JailStart -benchtime 40x -count 3
func BenchmarkJailStartSeccomp(b *testing.B) {
	levels := []string{jail.SeccompOff, jail.SeccompStrict, jail.SeccompNested}
	names := []string{"off", "strict", "nested"}
	for _, userNS := range []bool{false, true} {
		b.Run(fmt.Sprintf("userns=%v", userNS), func(b *testing.B) {
			if !userNS && os.Geteuid() != 0 {
				b.Skip("the dedicated-uid jail needs root")
			}
			took := make([][]time.Duration, len(levels))
			for i := 0; i < b.N; i++ {
				for l, level := range levels {
					r, w, err := os.Pipe()
					if err != nil {
						b.Fatal(err)
					}
					t0 := time.Now()
					j, err := jail.Start(jail.Spec{Argv: []string{"/bin/echo", "x"}, Binds: jail.SystemBinds(),
						UID: 2000000001, GID: 2000000001, UserNS: userNS, Seccomp: level}, jail.Options{Stdout: w, Stderr: w})
					w.Close()
					if err != nil {
						b.Fatal(err)
					}
					var buf [1]byte
					if _, err := r.Read(buf[:]); err != nil {
						b.Fatal(err)
					}
					took[l] = append(took[l], time.Since(t0))
					j.Wait()
					r.Close()
				}
			}
			for l, d := range took {
				slices.Sort(d)
				b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, names[l]+"-p50-ms")
				b.ReportMetric(float64(d[(len(d)*99)/100].Microseconds())/1000, names[l]+"-p99-ms")
			}
		})
	}
}

// BenchmarkSyscallUnderFilter: what the filter adds to a system call that
// passes it (getppid runs through the whole list), in a child started
// with StartFiltered and one without.
//
//	go test ./internal/jail -run '^$' -bench SyscallUnderFilter -count 3
func BenchmarkSyscallUnderFilter(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	for _, level := range []string{jail.SeccompOff, jail.SeccompStrict} {
		name := map[string]string{jail.SeccompOff: "off", jail.SeccompStrict: "strict"}[level]
		b.Run("seccomp="+name, func(b *testing.B) {
			cmd := exec.Command(self, "-test.run=^$")
			cmd.Env = append(os.Environ(), "JAILTEST_SYSCALLS="+strconv.Itoa(b.N))
			var out strings.Builder
			cmd.Stdout = &out
			if err := jail.StartFiltered(cmd, level); err != nil {
				b.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
			ns, err := strconv.ParseFloat(strings.TrimSpace(out.String()), 64)
			if err != nil {
				b.Fatalf("child said %q", out.String())
			}
			b.ReportMetric(ns, "ns/syscall")
		})
	}
}

func init() {
	if n, err := strconv.Atoi(os.Getenv("JAILTEST_SYSCALLS")); err == nil && n > 0 {
		t0 := time.Now()
		for range n {
			syscall.Getppid()
		}
		fmt.Println(float64(time.Since(t0).Nanoseconds()) / float64(n))
		os.Exit(0)
	}
}
