package interncmd

import "golang.org/x/sys/unix"

// NonDumpable keeps processes of the same user from reading this one's
// memory, environment and descriptors through /proc or ptrace.
func NonDumpable() { unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) }
