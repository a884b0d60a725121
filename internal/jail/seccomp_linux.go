package jail

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The shim takes over a binary started as SeccompArg0, before main runs.
func init() {
	if len(os.Args) > 0 && os.Args[0] == SeccompArg0 {
		runSeccompShim(os.Args[1:])
	}
}

// runSeccompShim installs the filter on every thread of this process and
// execs the program, which keeps it.
func runSeccompShim(args []string) {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "jail: seccomp shim: usage: level path argv...")
		os.Exit(126)
	}
	if err := installSeccomp(args[0], true); err != nil {
		fmt.Fprintf(os.Stderr, "jail: %v\n", err)
		os.Exit(126)
	}
	// The domain is the calling thread's: exec from the same thread.
	runtime.LockOSThread()
	if err := isolate(); err != nil && !errors.Is(err, ErrNoLandlock) {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(126)
	}
	err := unix.Exec(args[1], args[2:], os.Environ())
	fmt.Fprintf(os.Stderr, "jail: start %s: %v\n", args[2], err)
	os.Exit(126)
}

// StartFiltered starts cmd under the filter of level, stacked on whatever
// filter this process already has. The filter is installed on a thread of
// its own that forks the command and then ends (a goroutine that exits
// locked to its thread takes the thread with it), so this process keeps
// its own filter and pays no extra exec. cmd must not use
// SysProcAttr.Pdeathsig (it would fire when that thread ends) nor
// UseCgroupFD (clone3 is denied).
func StartFiltered(cmd *exec.Cmd, level string) error {
	if err := checkSeccomp(level); err != nil {
		return err
	}
	if level == SeccompOff {
		return cmd.Start()
	}
	if sys := cmd.SysProcAttr; sys != nil && (sys.Pdeathsig != 0 || sys.UseCgroupFD) {
		return errors.New("jail: StartFiltered: Pdeathsig and UseCgroupFD are not supported")
	}
	errc := make(chan error, 1)
	var start func()
	start = func() {
		// Never unlocked: the runtime ends this thread with the goroutine
		// (or, if it is the main thread, parks it for good), and hands
		// thread creation to a clean one meanwhile.
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread: /proc shows the process by its
			// credentials, so a domain put on it would let the command
			// into this process. It stays parked, untouched.
			go start()
			return
		}
		if err := installSeccomp(level, false); err != nil {
			errc <- err
			return
		}
		// Out of reach of this process and of its other commands
		// (landlock_linux.go); a kernel without Landlock is named at
		// start (Isolation).
		if err := isolate(); err != nil && !errors.Is(err, ErrNoLandlock) {
			errc <- err
			return
		}
		errc <- cmd.Start()
	}
	go start()
	return <-errc
}

// confineProgram puts the filter of s.Seccomp on the program the init is
// about to fork with sys, and returns the path and argv to fork. The
// filter goes on the init's own thread when the fork itself passes it;
// otherwise (a user namespace for the program, clone3 for a cgroup) the
// program is started through the shim. The init's thread then keeps the
// filter: it only waits and signals from there on.
func confineProgram(s *Spec, sys *syscall.SysProcAttr, path string) (string, []string) {
	level := s.Seccomp
	if level == SeccompOff {
		return path, s.Argv
	}
	if sys.Cloneflags&unix.CLONE_NEWUSER != 0 || sys.UseCgroupFD {
		return "/proc/self/exe", append([]string{SeccompArg0, level, path}, s.Argv...)
	}
	if err := installSeccomp(level, false); err != nil {
		fail("seccomp", err, "")
	}
	return path, s.Argv
}

// probeSeccomp checks, in a probe, that the program's filter can be put.
func probeSeccomp(s *Spec) {
	if s.Seccomp == SeccompOff {
		return
	}
	if err := installSeccomp(s.Seccomp, false); err != nil {
		fail("seccomp", err, "")
	}
}

// installSeccomp puts the filter of level on this thread, or with tsync on
// every thread of the process.
func installSeccomp(level string, tsync bool) error {
	prog, err := seccompProgram(level, nativeSeccompArch)
	if err != nil {
		return err
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return fmt.Errorf("seccomp: assemble: %w", err)
	}
	// Required to install a filter without CAP_SYS_ADMIN; the jail's
	// programs have it already.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(raw)), Filter: (*unix.SockFilter)(unsafe.Pointer(&raw[0]))}
	flags := uintptr(0)
	if tsync {
		flags = unix.SECCOMP_FILTER_FLAG_TSYNC
	}
	r, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(raw)
	if errno == 0 && r != 0 {
		// With TSYNC, the id of a thread that could not be synchronized.
		return fmt.Errorf("seccomp: thread %d could not take the filter", r)
	}
	if errno != 0 {
		hint := ""
		if errno == unix.EINVAL || errno == unix.ENOSYS {
			hint = " (this kernel has no seccomp filters: CONFIG_SECCOMP_FILTER)"
		}
		return fmt.Errorf("seccomp: install the filter: %w%s", errno, hint)
	}
	return nil
}

// seccompArch is what the filter needs to know of one architecture.
type seccompArch struct {
	audit uint32 // AUDIT_ARCH_* of seccomp_data.arch
	x32   bool   // syscall numbers with bit 30 set are another ABI (x32)
	// deny are the syscalls denied whatever the level, beyond the common
	// ones (those that exist only on this architecture).
	deny []uint32
}

// Syscalls denied at every level, on every architecture.
var seccompDenied = []uint32{
	// Other processes: tracing, their memory, their descriptors.
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_PIDFD_GETFD, unix.SYS_KCMP,
	// The kernel itself.
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD, unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD, unix.SYS_LOOKUP_DCOOKIE, unix.SYS_SYSLOG,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	// Keyrings (not namespaced).
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	// Files by handle, around the mount view.
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT, unix.SYS_FANOTIFY_INIT,
	// The machine: swap, reboot, clocks, accounting, quotas, NUMA policy, terminals.
	unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_REBOOT, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME,
	unix.SYS_SETTIMEOFDAY, unix.SYS_ACCT, unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD, unix.SYS_NFSSERVCTL,
	unix.SYS_MBIND, unix.SYS_SET_MEMPOLICY, unix.SYS_SET_MEMPOLICY_HOME_NODE, unix.SYS_MIGRATE_PAGES,
	unix.SYS_MOVE_PAGES, unix.SYS_VHANGUP,
	// Other namespaces, and the new mount API (never used by a nested jail's init).
	unix.SYS_SETNS, unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT, unix.SYS_FSOPEN, unix.SYS_FSCONFIG,
	unix.SYS_FSMOUNT, unix.SYS_FSPICK,
}

// Syscalls a nested jail's init needs, denied by the strict filter.
var seccompMounts = []uint32{unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_MOUNT_SETATTR}

// Namespace flags of clone and unshare (CLONE_NEWTIME shares its bit with
// clone's exit signal, so it is checked for unshare only).
const (
	cloneNamespaces   = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET
	unshareNamespaces = cloneNamespaces | unix.CLONE_NEWTIME
)

// Socket families a program may open (socket, socketpair); any other is
// EAFNOSUPPORT, as from a kernel without it. AF_VSOCK is the one that
// matters: a vsock reaches the hypervisor and other guests, and is not
// scoped to a network namespace. Measured (strace, 2026-11-29): Go's
// net.Interfaces and net.InterfaceAddrs, Node's os.networkInterfaces,
// glibc's getaddrinfo with AI_ADDRCONFIG (Python, getent) and ip(8) open
// AF_NETLINK with NETLINK_ROUTE; ss(8) NETLINK_SOCK_DIAG; glibc's nscd
// probe and curl AF_UNIX (curl also a socketpair); clients AF_INET and
// AF_INET6. Nothing else.
var seccompFamilies = []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// Netlink protocols a program may open: routes, addresses and links (in
// its own network namespace), and socket diagnostics. Any other is
// EPROTONOSUPPORT.
var seccompNetlink = []uint32{unix.NETLINK_ROUTE, unix.NETLINK_SOCK_DIAG}

// personality values a program may set (Docker's list): the default, a
// query, and the 32-bit and old-uname views.
var seccompPersonalities = []uint32{0, 0x0008, 0x20000, 0x20008, 0xffffffff}

// Offsets in struct seccomp_data (little-endian: an argument's low half first).
const (
	offNR   = 0
	offArch = 4
	offArg0 = 16
	offArg2 = 32
)

const (
	retAllow = unix.SECCOMP_RET_ALLOW
	retKill  = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retNoSys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	retNoAF  = unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)
	retNoPF  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPROTONOSUPPORT)
)

// seccompProgram builds the filter of level for arch.
func seccompProgram(level string, arch seccompArch) ([]bpf.Instruction, error) {
	if err := checkSeccomp(level); err != nil {
		return nil, err
	}
	if level == SeccompOff {
		return nil, errors.New("seccomp: no filter for level off")
	}
	if arch.audit == 0 {
		return nil, fmt.Errorf("seccomp: no filter for %s", runtime.GOARCH)
	}
	p := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: arch.audit, SkipTrue: 1},
		bpf.RetConstant{Val: retKill},
		bpf.LoadAbsolute{Off: offNR, Size: 4},
	}
	if arch.x32 {
		p = append(p, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: 0x40000000, SkipFalse: 1}, bpf.RetConstant{Val: retKill})
	}
	deny := func(nr, ret uint32) {
		p = append(p, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: nr, SkipTrue: 1}, bpf.RetConstant{Val: ret})
	}
	for _, nr := range append(seccompDenied, arch.deny...) {
		if nr == unix.SYS_SYSLOG && UnderGVisor() {
			// gVisor's kernel log is the Sentry's boot banner, nothing
			// of the host's: `dmesg` shows which kernel an intern has.
			continue
		}
		deny(nr, retEPERM)
	}
	deny(unix.SYS_CLONE3, retNoSys)
	// personality: only the values in the list.
	n := len(seccompPersonalities)
	p = append(p, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.SYS_PERSONALITY, SkipTrue: uint8(n + 3)},
		bpf.LoadAbsolute{Off: offArg0, Size: 4})
	for i, v := range seccompPersonalities {
		p = append(p, bpf.JumpIf{Cond: bpf.JumpEqual, Val: v, SkipTrue: uint8(n - i)})
	}
	p = append(p, bpf.RetConstant{Val: retEPERM}, bpf.RetConstant{Val: retAllow})
	// socket and socketpair: families by allowlist, at every level (the
	// daemon and its agent need no more than their commands).
	for _, nr := range []uint32{unix.SYS_SOCKET, unix.SYS_SOCKETPAIR} {
		p = append(p, socketFilter(nr)...)
	}
	if level == SeccompNested {
		return append(p, bpf.RetConstant{Val: retAllow}), nil
	}
	for _, nr := range seccompMounts {
		deny(nr, retEPERM)
	}
	// clone and unshare: not with a namespace flag (the flags are the
	// first argument of both on amd64 and arm64).
	for _, c := range []struct{ nr, mask uint32 }{{unix.SYS_CLONE, cloneNamespaces}, {unix.SYS_UNSHARE, unshareNamespaces}} {
		p = append(p, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: c.nr, SkipTrue: 4},
			bpf.LoadAbsolute{Off: offArg0, Size: 4},
			bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: c.mask, SkipFalse: 1},
			bpf.RetConstant{Val: retEPERM},
			bpf.RetConstant{Val: retAllow})
	}
	return append(p, bpf.RetConstant{Val: retAllow}), nil
}

// socketFilter is the block that checks the family (the first argument)
// and, for AF_NETLINK, the protocol (the third) of syscall nr, which is
// socket or socketpair; any other syscall skips it.
func socketFilter(nr uint32) []bpf.Instruction {
	var b []bpf.Instruction
	b = append(b, bpf.LoadAbsolute{Off: offArg0, Size: 4})
	// Jumps to "allow" (the last instruction) or "netlink" are patched
	// below, once the block's length is known.
	var toAllow []int
	for _, f := range seccompFamilies {
		if f == unix.AF_NETLINK {
			continue
		}
		toAllow = append(toAllow, len(b))
		b = append(b, bpf.JumpIf{Cond: bpf.JumpEqual, Val: f})
	}
	b = append(b, bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_NETLINK, SkipFalse: uint8(2 + len(seccompNetlink))},
		bpf.LoadAbsolute{Off: offArg2, Size: 4})
	for _, proto := range seccompNetlink {
		toAllow = append(toAllow, len(b))
		b = append(b, bpf.JumpIf{Cond: bpf.JumpEqual, Val: proto})
	}
	b = append(b, bpf.RetConstant{Val: retNoPF}, bpf.RetConstant{Val: retNoAF}, bpf.RetConstant{Val: retAllow})
	allow := len(b) - 1
	for _, i := range toAllow {
		j := b[i].(bpf.JumpIf)
		j.SkipTrue = uint8(allow - i - 1)
		b[i] = j
	}
	return append([]bpf.Instruction{bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: nr, SkipTrue: uint8(len(b))}}, b...)
}
