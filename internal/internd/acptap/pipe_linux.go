package acptap

import (
	"os"
	"syscall"
	"unsafe"
)

// pipeUnread is how many bytes wait unread in a pipe (FIONREAD).
func pipeUnread(f *os.File) int {
	if f == nil {
		return 0
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	var n int32
	rc.Control(func(fd uintptr) {
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); e != 0 {
			n = 0
		}
	})
	return int(n)
}
