package jail

import "fmt"

// The syscall filters the init can put on a jail's program (Spec.Seccomp).
// Both deny (EPERM, as container runtimes do) what a program in a jail has
// no business calling: ptrace and reading other processes' memory, kernel
// modules and kexec, bpf, keyrings, perf events, userfaultfd, file handles,
// swap, reboot, the clocks, the kernel log, accounting, quotas, io_uring and
// the rest of Docker's default deny list. Sockets of a family other than
// AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK (routes and socket diagnostics
// only) are EAFNOSUPPORT (EPROTONOSUPPORT for another netlink protocol):
// AF_VSOCK above all, which is not scoped to a network namespace. clone3 is ENOSYS (its flags are in
// memory the filter cannot read; libc falls back to clone, whose flags it
// can). A syscall of another architecture kills the process.
const (
	// SeccompStrict, the default, also denies new namespaces of any kind
	// (unshare, clone with CLONE_NEW*, setns) and every mount call.
	SeccompStrict = ""
	// SeccompNested lets the program make jails of its own (namespaces,
	// mount, pivot_root, umount): for the intern's daemon, whose built-in
	// agent runs manual-mode commands in a nested jail. The daemon applies
	// SeccompStrict to any other agent, the built-in agent to every command
	// it runs, and the nested jail's init to its program.
	SeccompNested = "nested"
	// SeccompOff puts no filter (benchmarks; a host without seccomp).
	SeccompOff = "off"
)

// SeccompArg0 is the argv[0] that makes a binary importing this package
// install a filter on itself and exec a program: {SeccompArg0, level,
// path, argv...}. The init starts a program through it when the filter
// cannot be put on the init's own thread before the fork (the program gets
// a user namespace of its own, which the strict filter denies).
const SeccompArg0 = "cohort-seccomp"

func checkSeccomp(level string) error {
	switch level {
	case SeccompStrict, SeccompNested, SeccompOff:
		return nil
	}
	return fmt.Errorf("jail: unknown seccomp level %q", level)
}
