package jail

import "golang.org/x/sys/unix"

var nativeSeccompArch = seccompArch{
	audit: unix.AUDIT_ARCH_X86_64,
	x32:   true,
	deny: []uint32{unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_CREATE_MODULE, unix.SYS_GET_KERNEL_SYMS,
		unix.SYS_QUERY_MODULE, unix.SYS_USELIB, unix.SYS_USTAT, unix.SYS_SYSFS, unix.SYS__SYSCTL},
}
