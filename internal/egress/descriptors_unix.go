//go:build unix

package egress

import "syscall"

// RaiseFileLimit raises this process's soft RLIMIT_NOFILE to its hard
// limit and returns the limit now in force. The Go runtime already does
// this at start (to hard-1) on every Unix since Go 1.19; calling it keeps
// the figure checked and said where the gateway starts rather than
// assumed, and leaves the limit alone when it is already there, so child
// processes (jails) keep the soft limit the runtime restores for them.
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur+1 < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return lim.Cur, err
		}
		lim = raised
	}
	return lim.Cur, nil
}
