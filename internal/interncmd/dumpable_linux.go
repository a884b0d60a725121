package interncmd

import (
	"bytes"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// NonDumpable keeps processes of the same user from reading this one's
// memory, environment and descriptors through /proc or ptrace.
func NonDumpable() { unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) }

// ScrubEnviron blanks name's value in the environment block the kernel
// shows as /proc/self/environ (the one exec put on the stack; Go works on
// its own copy, which keeps the value). Call it before NonDumpable: a
// non-dumpable process's /proc/self/mem is root's. Root can read any
// process's environ, and a Landlock domain does not stop that on every
// kernel; what it would find there is gone.
func ScrubEnviron(name string) {
	env, err := os.ReadFile("/proc/self/environ")
	if err != nil {
		return
	}
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return
	}
	// The fields after the command name's ")": env_start is field 50 of
	// proc(5), the 48th after it.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 48 {
		return
	}
	start, err := strconv.ParseUint(fields[47], 10, 64)
	if err != nil || start == 0 {
		return
	}
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer mem.Close()
	prefix := []byte(name + "=")
	off := 0
	for _, kv := range bytes.Split(env, []byte{0}) {
		if bytes.HasPrefix(kv, prefix) {
			mem.WriteAt(make([]byte, len(kv)-len(prefix)), int64(start)+int64(off+len(prefix)))
		}
		off += len(kv) + 1
	}
}
