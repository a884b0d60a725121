package jail

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// decide runs the filter on one syscall in a BPF interpreter. Its loads
// are big-endian; the filter reads 32-bit words only, so each word is
// written big-endian at the offset where the kernel puts it.
func decide(t *testing.T, prog []bpf.Instruction, arch, nr uint32, arg0 uint32) uint32 {
	t.Helper()
	return decideArgs(t, prog, arch, nr, arg0, 0)
}

// decideArgs is decide with the third argument too.
func decideArgs(t *testing.T, prog []bpf.Instruction, arch, nr, arg0, arg2 uint32) uint32 {
	t.Helper()
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[offNR:], nr)
	binary.BigEndian.PutUint32(data[offArch:], arch)
	binary.BigEndian.PutUint32(data[offArg0:], arg0)
	binary.BigEndian.PutUint32(data[offArg2:], arg2)
	ret, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

func TestSeccompProgram(t *testing.T) {
	strict, err := seccompProgram(SeccompStrict, nativeSeccompArch)
	if err != nil {
		t.Fatal(err)
	}
	nested, err := seccompProgram(SeccompNested, nativeSeccompArch)
	if err != nil {
		t.Fatal(err)
	}
	if raw, err := bpf.Assemble(strict); err != nil || len(raw) > 4096 {
		t.Fatalf("assemble: %d instructions, %v", len(raw), err)
	}
	native := nativeSeccompArch.audit
	for _, nr := range append(seccompDenied, nativeSeccompArch.deny...) {
		for name, prog := range map[string][]bpf.Instruction{"strict": strict, "nested": nested} {
			if got := decide(t, prog, native, nr, 0); got != retEPERM {
				t.Errorf("%s: syscall %d: %#x, want EPERM", name, nr, got)
			}
		}
	}
	for _, nr := range seccompMounts {
		if got := decide(t, strict, native, nr, 0); got != retEPERM {
			t.Errorf("strict: mount syscall %d: %#x, want EPERM", nr, got)
		}
		if got := decide(t, nested, native, nr, 0); got != retAllow {
			t.Errorf("nested: mount syscall %d: %#x, want allowed", nr, got)
		}
	}
	for _, nr := range []uint32{unix.SYS_READ, unix.SYS_WRITE, unix.SYS_GETPID, unix.SYS_EXECVE, unix.SYS_MMAP, unix.SYS_FUTEX} {
		if got := decide(t, strict, native, nr, 0); got != retAllow {
			t.Errorf("strict: syscall %d: %#x, want allowed", nr, got)
		}
	}
	thread := uint32(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD)
	cases := []struct {
		nr, arg         uint32
		strict, nesting uint32
	}{
		{unix.SYS_CLONE, thread, retAllow, retAllow},
		{unix.SYS_CLONE, unix.CLONE_VFORK | unix.CLONE_VM | uint32(unix.SIGCHLD), retAllow, retAllow},
		{unix.SYS_CLONE, unix.CLONE_NEWUSER | uint32(unix.SIGCHLD), retEPERM, retAllow},
		{unix.SYS_CLONE, unix.CLONE_NEWNET, retEPERM, retAllow},
		{unix.SYS_UNSHARE, unix.CLONE_NEWUSER, retEPERM, retAllow},
		{unix.SYS_UNSHARE, unix.CLONE_NEWNS, retEPERM, retAllow},
		{unix.SYS_UNSHARE, unix.CLONE_NEWTIME, retEPERM, retAllow},
		{unix.SYS_UNSHARE, unix.CLONE_FILES, retAllow, retAllow},
		{unix.SYS_CLONE3, 0, retNoSys, retNoSys},
		{unix.SYS_PERSONALITY, 0xffffffff, retAllow, retAllow},
		{unix.SYS_PERSONALITY, 0, retAllow, retAllow},
		{unix.SYS_PERSONALITY, 0x0040000 /* ADDR_NO_RANDOMIZE */, retEPERM, retEPERM},
	}
	for _, c := range cases {
		if got := decide(t, strict, native, c.nr, c.arg); got != c.strict {
			t.Errorf("strict: syscall %d (%#x): %#x, want %#x", c.nr, c.arg, got, c.strict)
		}
		if got := decide(t, nested, native, c.nr, c.arg); got != c.nesting {
			t.Errorf("nested: syscall %d (%#x): %#x, want %#x", c.nr, c.arg, got, c.nesting)
		}
	}
	// Socket families by allowlist, at both levels; netlink for routes
	// and socket diagnostics only.
	sockets := []struct {
		family, proto uint32
		want          uint32
	}{
		{unix.AF_UNIX, 0, retAllow},
		{unix.AF_INET, 0, retAllow},
		{unix.AF_INET6, 0, retAllow},
		{unix.AF_NETLINK, unix.NETLINK_ROUTE, retAllow},
		{unix.AF_NETLINK, unix.NETLINK_SOCK_DIAG, retAllow},
		{unix.AF_NETLINK, unix.NETLINK_KOBJECT_UEVENT, retNoPF},
		{unix.AF_NETLINK, unix.NETLINK_AUDIT, retNoPF},
		{unix.AF_NETLINK, unix.NETLINK_GENERIC, retNoPF},
		{unix.AF_VSOCK, 0, retNoAF},
		{unix.AF_PACKET, 0, retNoAF},
		{unix.AF_ALG, 0, retNoAF},
		{unix.AF_BLUETOOTH, 0, retNoAF},
		{unix.AF_XDP, 0, retNoAF},
		{unix.AF_UNSPEC, 0, retNoAF},
		{unix.AF_UNIX | 0x100, 0, retNoAF},
	}
	for _, nr := range []uint32{unix.SYS_SOCKET, unix.SYS_SOCKETPAIR} {
		for _, c := range sockets {
			for name, prog := range map[string][]bpf.Instruction{"strict": strict, "nested": nested} {
				if got := decideArgs(t, prog, native, nr, c.family, c.proto); got != c.want {
					t.Errorf("%s: syscall %d family %d protocol %d: %#x, want %#x", name, nr, c.family, c.proto, got, c.want)
				}
			}
		}
	}
	// The protocol of another family is not looked at.
	if got := decideArgs(t, strict, native, unix.SYS_SOCKET, unix.AF_INET, unix.IPPROTO_UDP); got != retAllow {
		t.Errorf("strict: socket(AF_INET, …, IPPROTO_UDP): %#x, want allowed", got)
	}
	// Another architecture's syscalls (i386 on amd64, arm on arm64, or
	// either on the other) kill the process, whatever they are.
	for _, arch := range []uint32{unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_ARM, unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_AARCH64} {
		if arch == native {
			continue
		}
		for _, nr := range []uint32{unix.SYS_READ, unix.SYS_GETPID, 0} {
			if got := decide(t, strict, arch, nr, 0); got != retKill {
				t.Errorf("arch %#x syscall %d: %#x, want kill", arch, nr, got)
			}
		}
	}
	if nativeSeccompArch.x32 {
		if got := decide(t, strict, native, 0x40000000|unix.SYS_GETPID, 0); got != retKill {
			t.Errorf("x32 getpid: %#x, want kill", got)
		}
	}
}
