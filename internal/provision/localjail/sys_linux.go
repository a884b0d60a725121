package localjail

import (
	"os"
	"syscall"
)

// sysProcAttr puts a daemon in its own process group (so stopping it stops
// its agent too) and has the kernel signal it if the gateway dies, so no
// daemon outlives the gateway that started it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// owner is a file's owner uid.
func owner(st os.FileInfo) int {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(sys.Uid)
	}
	return -1
}
