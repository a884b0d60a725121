package jail

import (
	"bytes"
	"sync"

	"golang.org/x/sys/unix"
)

// UnderGVisor reports whether this process runs on gVisor's kernel (an
// intern of --provisioner gvisor, ADR 0981), whose boot log starts so.
// There a jail's init is not set a parent-death signal by its caller: Go's
// fork, seeing the child's getppid() differ from the caller's pid (0
// across a new PID namespace), sends the child SIGKILL, which Linux ignores
// for a PID namespace's init and gVisor delivers. The init sets it itself.
var UnderGVisor = sync.OnceValue(func() bool {
	buf := make([]byte, 256)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	first, _, _ := bytes.Cut(buf[:max(n, 0)], []byte("\n"))
	return err == nil && bytes.Contains(first, []byte("Starting gVisor"))
})
