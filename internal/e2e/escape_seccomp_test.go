package e2e_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// What the seccomp filter must refuse from a shell an intern controls,
// through the real gateway and jail: a user namespace (uid 0 and mount
// rights in a namespace of its own), a mount namespace, a mount inside a
// user namespace, ptrace, bpf and the keyrings. Each attempt prints a
// marker only if it worked ($((…)) keeps the marker out of the command's
// own text). In manual mode, after allow_once, the command runs in the
// built-in agent's nested jail, whose program gets the strict filter too.
func seccompAttempts() []attempt {
	py := func(name string, nr uintptr, args string, marker int) string {
		// errno 1 is EPERM: the filter's answer. Anything else reached the kernel.
		return fmt.Sprintf(`python3 -c 'import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(%d, %s)
e = ctypes.get_errno()
print("%s", r, os.strerror(e) if r < 0 else "")
if r >= 0 or e != 1: print("reached-%%d" %% (%d+1))' 2>&1`, nr, args, name, marker)
	}
	return []attempt{
		{name: "a user namespace", command: `unshare -Ur id -u 2>&1 && echo reached-$((1000+1))`, success: []string{"reached-1001"}},
		{name: "a mount namespace", command: `unshare -m true 2>&1 && echo reached-$((1000+2))`, success: []string{"reached-1002"}},
		{name: "a mount in a user namespace", command: `unshare -Urm sh -c 'mount -t tmpfs none /tmp && echo reached-$((1000+3))' 2>&1`, success: []string{"reached-1003"}},
		{name: "ptrace", command: `strace -f -o /dev/null true 2>&1 && echo reached-$((1000+4))`, success: []string{"reached-1004"}},
		{name: "ptrace attach", command: `sleep 5 & S=$!; strace -p $S -o /dev/null 2>&1 & T=$!; sleep 0.5; grep -q "TracerPid:[[:space:]]*[1-9]" /proc/$S/status && echo reached-$((1000+5)); kill $S $T 2>/dev/null; true`, success: []string{"reached-1005"}},
		{name: "bpf", command: py("bpf", unix.SYS_BPF, "0xffff, 0, 0", 1005), success: []string{"reached-1006"}},
		{name: "keyctl", command: py("keyctl", unix.SYS_KEYCTL, "0, -2, 1", 1006), success: []string{"reached-1007"}},
	}
}

func TestEscapeSeccomp(t *testing.T) {
	for _, agent := range []string{"built-in", "third-party"} {
		t.Run(agent, func(t *testing.T) {
			t.Parallel()
			builtin := agent == "built-in"
			args := []string{"--provisioner", "local", "--log-level", "info"}
			modes := []string{"self-drive", "manual, before escalation", "manual, escalated"}
			if !builtin {
				bin := shellAgent(t)
				args = append(args, "--agent-command", bin, "--jail-ro-bind", filepath.Dir(bin))
				modes = []string{"self-drive"}
			}
			c := &cluster{dataDir: t.TempDir()}
			c.dbArgs = []string{"--data-dir", c.dataDir}
			tg := &target{c: c}
			tg.gw = c.Gateway(t, args...)
			c.load(t)
			tg.waitRunning(t, c.Demo)
			for _, mode := range modes {
				for _, a := range seccompAttempts() {
					out := tg.run(t, mode, a.command, builtin)
					a.check(t, mode, out, nil)
				}
			}
		})
	}
}
