// Package jail runs a program in a set of Linux namespaces made by Cohort
// itself, with no helper binary: its own mount view (a fresh root holding
// only what the Spec binds), its own PIDs, its own network (loopback only,
// plus relays), IPC and host name, and a user that is never the caller's.
//
// The caller re-executes its own binary as the jail's init (pid 1): any
// binary that imports this package becomes one, because the package's init
// function takes over when argv[0] is InitArg0. The init builds the mount
// view (bind, pivot_root, detach the old root), brings up loopback, serves
// the relays, drops to the jail's user and starts the program, then reaps
// children until the program exits, and exits with its status: the kernel
// kills whatever else is left in the PID namespace.
//
// Two ways to get the privileges this needs:
//   - the caller is root: the namespaces belong to the host's user
//     namespace, the init is root only while it builds the view, and the
//     program runs as a dedicated unprivileged host uid (Spec.UID) with no
//     capabilities. Mounts made by the host's root cannot be undone by it.
//   - otherwise (or Spec.UserNS): a user namespace maps the jail's root to
//     the caller's uid, and the program runs as uid 1000 of a nested user
//     namespace, so it holds no capability over the mounts either. This is
//     also how a jailed, unprivileged agent makes a stricter jail inside its
//     own (Spec.Inherit).
//
// Relays are the only way out of the network namespace: the init listens on
// 127.0.0.1:Port inside the jail and hands every accepted connection, with
// the relay's kind byte, to the caller over a socket pair (the connection's
// own descriptor crosses, so no bytes are copied by the init). The caller
// decides what each kind may reach.
package jail

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// InitArg0 is the argv[0] that makes a binary importing this package act as
// a jail's init.
const InitArg0 = "cohort-jail-init"

// ProgramUID is the uid the program has inside a user-namespace jail.
const ProgramUID = 1000

// Bind puts a host path (file or directory) at a path inside the jail.
type Bind struct {
	Src string `json:"src"`
	Dst string `json:"dst"`
	// Writable binds read-write; otherwise read-only.
	Writable bool `json:"writable,omitempty"`
	// Optional skips a source that does not exist.
	Optional bool `json:"optional,omitempty"`
}

// File is a file the init writes into the jail (read-only), e.g. an
// /etc/passwd naming the jail's user.
type File struct {
	Dst     string `json:"dst"`
	Content string `json:"content"`
}

// Relay is a loopback port inside the jail whose connections reach the
// caller, tagged with Kind.
type Relay struct {
	Port int  `json:"port"`
	Kind byte `json:"kind"`
}

// Spec describes one jail.
type Spec struct {
	// Argv is the program, as a path inside the jail.
	Argv []string `json:"argv"`
	// Env is the program's whole environment.
	Env []string `json:"env"`
	// Dir is the working directory inside the jail ("/" when empty).
	Dir string `json:"dir,omitempty"`
	// Inherit starts from the caller's own root, read-only, instead of an
	// empty one (a stricter jail inside a jail). Otherwise the root holds
	// only Binds, Symlinks, Files, a minimal /dev, /proc and /tmp.
	Inherit bool `json:"inherit,omitempty"`
	// Binds are mounted in order; a later one may sit inside an earlier.
	Binds []Bind `json:"binds,omitempty"`
	// Symlinks maps a path inside the jail to its target (merged /usr:
	// /bin → usr/bin).
	Symlinks map[string]string `json:"symlinks,omitempty"`
	Files    []File            `json:"files,omitempty"`
	// Hide covers these paths inside the jail with an empty read-only
	// directory when they exist (a host directory that a bind would
	// otherwise show).
	Hide []string `json:"hide,omitempty"`
	// Relays open the only ways out of the network namespace.
	Relays []Relay `json:"relays,omitempty"`
	// UID and GID are the host ids the program runs as when the caller is
	// root (and UserNS is false). Never 0.
	UID int `json:"uid,omitempty"`
	GID int `json:"gid,omitempty"`
	// UserNS forces the user-namespace way even for root.
	UserNS bool `json:"userns,omitempty"`
	// Hostname inside the jail ("intern" when empty).
	Hostname string `json:"hostname,omitempty"`
	// Probe builds the jail and exits 0 without running a program: the
	// check that this machine can make jails.
	Probe bool `json:"probe,omitempty"`

	// Set by Start, read by the init.
	privileged bool
}

// Jail is a started jail.
type Jail struct {
	// Process is the init; it exits with the program's status.
	Process *os.Process
	relays  *net.UnixConn
	done    chan struct{}
	state   *os.ProcessState
	err     error
}

// ErrUnsupported is returned where the platform has no namespaces.
var ErrUnsupported = errors.New("jail: Linux namespaces are not available on this platform")

// Options are how the caller connects to the init.
type Options struct {
	// Stdout and Stderr of the program (and the init's own errors on
	// Stderr); nil discards.
	Stdout, Stderr *os.File
	// Files are passed to the program as descriptors 3, 4, …
	Files []*os.File
}

// Wait waits for the init to exit and returns its state.
func (j *Jail) Wait() (*os.ProcessState, error) {
	<-j.done
	return j.state, j.err
}

// Done is closed when the init has exited.
func (j *Jail) Done() <-chan struct{} { return j.done }

// check validates a Spec before any process starts.
func (s *Spec) check() error {
	if len(s.Argv) == 0 && !s.Probe {
		return errors.New("jail: no program")
	}
	for _, b := range s.Binds {
		if !filepath.IsAbs(b.Src) || !filepath.IsAbs(b.Dst) {
			return fmt.Errorf("jail: bind %s → %s: paths must be absolute", b.Src, b.Dst)
		}
	}
	for _, r := range s.Relays {
		if r.Port <= 0 || r.Port > 65535 {
			return fmt.Errorf("jail: relay port %d", r.Port)
		}
	}
	return nil
}

// SystemBinds are the host's read-only directories that programs need to
// run (binaries, libraries, /etc for certificates, users and resolver
// settings). Missing ones are skipped; merged-/usr links are kept as links.
func SystemBinds() []Bind {
	var out []Bind
	for _, p := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"} {
		out = append(out, Bind{Src: p, Dst: p, Optional: true})
	}
	return out
}
