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
//   - otherwise: a user namespace maps the jail's root to the caller's uid
//     and uid 1000 to an id of the caller's subordinate ranges (/etc/subuid
//     and /etc/subgid, written by newuidmap and newgidmap; see
//     subid_linux.go); the init drops the caller's groups and runs, like
//     the program, as uid 1000, which is never the caller's host user.
//     Without a range, Start refuses and says how to add one.
//   - a jail in a jail (Spec.Inherit), and root with Spec.UserNS: the user
//     namespace maps only the caller's uid, and the program runs as uid
//     1000 of a nested user namespace, so it holds no capability over the
//     mounts. This is how a jailed, unprivileged agent makes a stricter
//     jail inside its own.
//
// Relays are the only way out of the network namespace: the init listens on
// 127.0.0.1:Port inside the jail and hands every accepted connection, with
// the relay's kind byte, to the caller over a socket pair (the connection's
// own descriptor crosses, so no bytes are copied by the init). The caller
// decides what each kind may reach.
//
// A jail with a Control path outlives its caller: the init also listens on
// that unix socket (bound on the host before the jail is entered, so
// nothing inside can see it), and whichever caller is attached receives the
// relays' connections, the program's output and its exit status, and may
// signal or kill it. A later process attaches (Attach) and takes over; with
// no caller attached for Spec.Orphan, the jail stops by itself. This is how
// a gateway restart leaves its interns' runs alive.
package jail

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
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
	// Copy copies the source into the jail's root instead of mounting it:
	// its directories, symlinks and regular files that every user may read,
	// nothing else (what only an owner or a group may read stays out).
	Copy bool `json:"copy,omitempty"`
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
	// View, when set, is a root made ready before the jail (a directory
	// of the caller's view, read-only, with a /tmp and /dev of its own):
	// the init enters it by chroot instead of building one with mounts,
	// and Binds, Symlinks, Files and Hide must be empty. gVisor's kernel
	// of this release mounts nothing in a user namespace, so a sandbox's
	// runtime makes its commands' view when it starts (CommandView,
	// ADR 0985). There is no /proc unless the view has one.
	View string `json:"view,omitempty"`
	// Binds are mounted in order; a later one may sit inside an earlier.
	Binds []Bind `json:"binds,omitempty"`
	// Symlinks maps a path inside the jail to its target (merged /usr:
	// /bin → usr/bin).
	Symlinks map[string]string `json:"symlinks,omitempty"`
	Files    []File            `json:"files,omitempty"`
	// Hide covers these paths inside the jail with an empty read-only
	// directory when they exist (a host directory that a bind would
	// otherwise show). A path in the jail's own /tmp, /dev or /proc is
	// not covered (nothing of the host shows there): only the binds
	// inside it are.
	Hide []string `json:"hide,omitempty"`
	// Relays open the only ways out of the network namespace.
	Relays []Relay `json:"relays,omitempty"`
	// UID and GID are the host ids the program runs as when the caller is
	// root (and UserNS is false). Never 0.
	UID int `json:"uid,omitempty"`
	GID int `json:"gid,omitempty"`
	// UserNS forces the user-namespace way even for root.
	UserNS bool `json:"userns,omitempty"`
	// SubID picks, for a caller that is not root, which id of its
	// subordinate uid and gid ranges (/etc/subuid, /etc/subgid) the program
	// runs as: the range's start plus SubID modulo its size (see HostIDs).
	SubID int `json:"subid,omitempty"`
	// Hostname inside the jail ("intern" when empty).
	Hostname string `json:"hostname,omitempty"`
	// Probe builds the jail and exits 0 without running a program: the
	// check that this machine can make jails.
	Probe bool `json:"probe,omitempty"`
	// Control, a host path, makes the jail outlive its caller (see the
	// package comment). Its directory must be the caller's alone.
	Control string `json:"control,omitempty"`
	// Orphan is how long a Control jail runs with no caller attached
	// before it stops its program (SIGTERM, then everything 5 s later).
	// 0 stops it as soon as its caller is gone, as a jail without Control.
	Orphan time.Duration `json:"orphan,omitempty"`
	// Tag is what the init tells each caller that attaches: which jail
	// this is (the caller decides whether it is the one it wants).
	Tag string `json:"tag,omitempty"`
	// Limits bound the jail's memory, processes, CPU share, tmpfs and file
	// size (limits.go).
	Limits Limits `json:"limits,omitempty"`
	// Seccomp is the syscall filter on the program: SeccompStrict (the
	// default), SeccompNested or SeccompOff.
	Seccomp string `json:"seccomp,omitempty"`
	// Init is the host path of the executable that becomes the jail's
	// init; empty: the caller's own binary (/proc/self/exe). It must be a
	// build of the same tree that imports this package (cmd/cohort or
	// cmd/cohort-intern): the caller and the init speak an unversioned
	// protocol. The init re-executes its own binary for the seccomp shim.
	Init string `json:"-"`
}

// CommandView is where a gVisor sandbox holds its commands' view (Spec.View):
// the sandbox's binds again, every one read-only, with a /tmp and a /dev of
// its own (internal/provision/gvisor).
const CommandView = "/run/cohort/commands"

// Jail is a started or attached jail.
type Jail struct {
	// Process is the init of a started jail (nil for an attached one); it
	// exits with the program's status.
	Process *os.Process
	// conn carries relay connections, and with Control the program's
	// output and exit, from the init; and signals to it.
	conn  *net.UnixConn
	conns chan accepted
	// done closes when the init has exited (without Control), or when the
	// control connection has ended (with it: the init exited, another
	// caller attached, or Detach).
	done   chan struct{}
	reaped chan struct{} // a started jail's init has exited
	state  *os.ProcessState
	err    error

	control bool
	tag     string
	pid     int
	output  io.Writer
	mu      sync.Mutex
	exit    int           // the program's status as the init reported it; -1 unknown
	gone    chan struct{} // a Control jail's: closed by Detach
	detach  sync.Once
}

type accepted struct {
	kind byte
	c    net.Conn
}

// ErrUnsupported is returned where the platform has no namespaces.
var ErrUnsupported = errors.New("jail: Linux namespaces are not available on this platform")

// ErrSubIDs is the cause of a caller that is not root and cannot map a
// jail's program to ids of its own: no subordinate range, or no
// newuidmap. Its message names the fix.
var ErrSubIDs = errors.New("jail: no subordinate ids for the program")

// Options are how the caller connects to the init.
type Options struct {
	// Stdout and Stderr of the program (and the init's own errors on
	// Stderr); nil discards.
	Stdout, Stderr *os.File
	// Files are passed to the program as descriptors 3, 4, …
	Files []*os.File
	// Output receives the program's stdout and stderr of a Control jail,
	// forwarded by the init to the attached caller (Stdout and Stderr then
	// get only the init's own errors while it builds the jail).
	Output io.Writer
}

// Wait waits for a started jail's init to exit and returns its state (for
// an attached one, only until it is no longer attached).
func (j *Jail) Wait() (*os.ProcessState, error) {
	if j.reaped == nil {
		<-j.done
		return nil, nil
	}
	<-j.reaped
	return j.state, j.err
}

// Done is closed when the init has exited, or for a Control jail when this
// caller is no longer attached (the init exited, Detach, or another caller
// attached).
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
	if s.Control != "" && !filepath.IsAbs(s.Control) {
		return fmt.Errorf("jail: control path %s must be absolute", s.Control)
	}
	if s.Orphan < 0 {
		return errors.New("jail: negative orphan timeout")
	}
	return checkSeccomp(s.Seccomp)
}

// SystemBinds are the host's read-only directories that programs need to
// run (binaries, libraries), and of /etc the entries of EtcAllowlist,
// copied. Missing ones are skipped; merged-/usr links are kept as links.
func SystemBinds() []Bind {
	var out []Bind
	for _, p := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		out = append(out, Bind{Src: p, Dst: p, Optional: true})
	}
	for _, p := range EtcAllowlist {
		out = append(out, Bind{Src: "/etc/" + p, Dst: "/etc/" + p, Optional: true, Copy: true})
	}
	return out
}

// EtcAllowlist is what of the host's /etc a jail shows (besides the
// passwd and group files a Spec writes): resolver and name service
// settings, certificates, time zone, the dynamic linker's cache, the
// alternatives links programs are reached through, MIME types. The
// host's accounts, its services' settings and secrets stay out.
var EtcAllowlist = []string{
	"resolv.conf", "hosts", "host.conf", "nsswitch.conf", "gai.conf", "services", "protocols",
	"ssl", "ca-certificates", "ca-certificates.conf", "pki", "crypto-policies",
	"localtime", "timezone",
	"ld.so.conf", "ld.so.conf.d", "ld.so.cache",
	"alternatives", "mime.types", "os-release", "inputrc", "gitconfig",
}

// Messages between the init and its caller, one per packet
// (SOCK_SEQPACKET keeps their boundaries).
const (
	msgAttach = 'A' // caller → init: first on a control connection: take the jail over
	msgHello  = 'h' // init → caller: 'h' + Tag, the answer to msgAttach
	msgRelay  = 'r' // init → caller: 'r' + kind, with the connection's descriptor
	msgOutput = 'o' // init → caller: 'o' + a chunk of the program's output
	msgExit   = 'x' // init → caller: 'x' + the program's status in decimal; the init then exits
	msgSignal = 's' // caller → init: 's' + a signal number (one byte) for the program
	msgKill   = 'k' // caller → init: end the jail now
	msgOrphan = 'a' // caller → init: 'a' + Spec.Orphan in nanoseconds, decimal, from now on
)

// maxPacket bounds one message (an output chunk is at most this less one).
const maxPacket = 32 << 10

// Pid is the init's pid in this process's PID namespace.
func (j *Jail) Pid() int { return j.pid }

// Tag returns what the jail's init said it is (Spec.Tag; Control jails).
func (j *Jail) Tag() string { return j.tag }

// Exit returns the program's status once a Control jail's init reported
// it (ok false if it ended without saying: killed, or detached).
func (j *Jail) Exit() (code int, ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.exit, j.exit >= 0
}
