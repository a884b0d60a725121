package jail_test

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cohort-dev/cohort/internal/jail"
)

// The i386 ABI is another way into the kernel from an amd64 process
// (int $0x80, with i386 numbers): its calls must not reach the syscall
// list at all. The child runs getpid that way.
func init() {
	if os.Getenv("JAILTEST_INT80") != "1" {
		return
	}
	// mov eax, 20 (getpid on i386); int 0x80; ret
	code := []byte{0xb8, 0x14, 0x00, 0x00, 0x00, 0xcd, 0x80, 0xc3}
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		os.Stdout.WriteString("mmap: " + err.Error())
		os.Exit(3)
	}
	copy(mem, code)
	entry := uintptr(unsafe.Pointer(&mem[0]))
	closure := &entry
	f := *(*func())(unsafe.Pointer(&closure))
	f()
	os.Stdout.WriteString("returned")
	os.Exit(0)
}

func TestSeccompKillsForeignArchitecture(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(level string) (string, *os.ProcessState) {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), "JAILTEST_INT80=1")
		var out strings.Builder
		cmd.Stdout = &out
		if err := jail.StartFiltered(cmd, level); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		return out.String(), cmd.ProcessState
	}
	out, st := run(jail.SeccompOff)
	if !st.Success() || out != "returned" {
		t.Skipf("this kernel runs no i386 system calls (%v %q)", st, out)
	}
	out, st = run(jail.SeccompStrict)
	ws := st.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGSYS {
		t.Fatalf("an i386 getpid under the filter: %v, output %q; want killed by SIGSYS", st, out)
	}
}
