package jail

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cohort-dev/cohort/internal/spawn"
)

// wire is what the caller sends the init on descriptor 3.
type wire struct {
	Spec
	Privileged bool `json:"privileged"`
	// SubIDs: the init drops to ProgramUID, which maps to a subordinate id
	// of the caller (see subid_linux.go), instead of a nested namespace
	// mapping the program to the caller.
	SubIDs bool `json:"subids,omitempty"`
	// Descriptors is how many descriptors, from fdFirst on, are the program's.
	Descriptors int `json:"descriptors"`
}

// Start starts the jail's init. The program starts once the init has built
// the jail; if the init cannot build it, it exits with status 126 and says
// why on Stderr (see Probe for a check with a readable error). A jail with
// Spec.Control has this caller attached (see Attach).
func Start(spec Spec, o Options) (*Jail, error) {
	if err := spec.check(); err != nil {
		return nil, err
	}
	w := wire{Spec: spec, Privileged: os.Geteuid() == 0 && !spec.UserNS, Descriptors: len(o.Files)}
	if w.Privileged && (spec.UID <= 0 || spec.GID <= 0) {
		return nil, errors.New("jail: a root caller must name the program's unprivileged uid and gid")
	}
	var maps idMaps
	if !w.Privileged && usesRange(spec) {
		var err error
		if maps, err = programMaps(spec); err != nil {
			return nil, err
		}
		w.SubIDs = true
	}
	payload, err := json.Marshal(w)
	if err != nil {
		return nil, err
	}
	var ctlFile *os.File
	if spec.Control != "" {
		if ctlFile, err = listenControl(spec.Control); err != nil {
			return nil, err
		}
		defer ctlFile.Close()
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer specR.Close()
	var initEnd *os.File
	var conn *net.UnixConn
	if len(spec.Relays) > 0 || spec.Control != "" {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			specW.Close()
			return nil, fmt.Errorf("jail: relay socket: %w", err)
		}
		mine := os.NewFile(uintptr(fds[0]), "jail-relays")
		initEnd = os.NewFile(uintptr(fds[1]), "jail-relays-init")
		defer initEnd.Close()
		c, err := net.FileConn(mine)
		mine.Close()
		if err != nil {
			specW.Close()
			return nil, fmt.Errorf("jail: relay socket: %w", err)
		}
		conn = c.(*net.UnixConn)
	}
	sys := &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Setpgid:    true,
	}
	if spec.Control == "" && !UnderGVisor() {
		// No jail outlives its caller, unless it has a control socket for
		// the next one. (Under gVisor the init sets it itself: runInit.)
		sys.Pdeathsig = syscall.SIGKILL
	}
	initPath := spec.Init
	if initPath == "" {
		// This very binary, whatever has become of its path.
		initPath = "/proc/self/exe"
	}
	cmd := &exec.Cmd{
		Path:        initPath,
		Args:        []string{InitArg0},
		Env:         []string{},
		ExtraFiles:  append([]*os.File{specR, initEnd, ctlFile}, o.Files...),
		SysProcAttr: sys,
	}
	if o.Stdout != nil {
		cmd.Stdout = o.Stdout
	}
	if o.Stderr != nil {
		cmd.Stderr = o.Stderr
	}
	switch {
	case w.SubIDs:
		// newuidmap writes the maps once the init has started: until then
		// its uid is unmapped, and only ambient capabilities survive its
		// exec. It reads the spec only after the maps are written.
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.AmbientCaps = ambientCaps()
	case !w.Privileged:
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
	}
	// From a thread that never ends: a Pdeathsig fires when the thread
	// that forked the init ends, not the process (internal/spawn).
	if err := spawn.Start(cmd); err != nil {
		specW.Close()
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("jail: start: %w%s", err, startHint(err))
	}
	if w.SubIDs {
		if err := maps.write(cmd.Process.Pid); err != nil {
			specW.Close()
			if conn != nil {
				conn.Close()
			}
			cmd.Process.Kill()
			cmd.Wait()
			return nil, err
		}
	}
	// The init waits for its spec: it is in the jail's cgroups before
	// it does anything else.
	cgroups, err := placeInCgroups(spec.Limits, cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		specW.Close()
		if conn != nil {
			conn.Close()
		}
		return nil, err
	}
	// Written before Start returns, not behind it: a caller that exits
	// right after starting a Control jail (one meant to outlive it) must
	// not take the spec with it. The init reads it first thing; if the
	// init is already gone the write fails and its exit says why.
	specW.Write(payload)
	specW.Close()
	j := &Jail{Process: cmd.Process, conn: conn, done: make(chan struct{}), control: spec.Control != "",
		tag: spec.Tag, pid: cmd.Process.Pid, output: o.Output, exit: -1}
	reaped := make(chan struct{})
	j.reaped = reaped
	go func() {
		j.err = cmd.Wait()
		j.state = cmd.ProcessState
		// Before Wait returns: a caller that exits next (cohort intern
		// --jail) leaves no cgroup behind.
		removeCgroups(cgroups, 10*time.Second)
		close(reaped)
	}()
	if conn != nil {
		j.conns = make(chan accepted)
		stop := reaped
		if j.control {
			j.gone = make(chan struct{})
			stop = j.gone
		}
		go j.read(stop)
	}
	if !j.control {
		go func() {
			<-reaped
			if conn != nil {
				conn.Close()
			}
			close(j.done)
		}()
	}
	return j, nil
}

// listenControl binds the control socket here, in the caller's network
// namespace (a socket shows in /proc/net/unix of the namespace it was made
// in: the jail's shows nothing of the host), and returns its descriptor
// for the init.
func listenControl(path string) (*os.File, error) {
	if err := removeStale(path); err != nil {
		return nil, err
	}
	name, done, err := sockName(path)
	if err != nil {
		return nil, fmt.Errorf("jail: control socket: %w", err)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
	done()
	if err != nil {
		return nil, fmt.Errorf("jail: control socket: %w", err)
	}
	// The file outlives this listener: removing it is the next caller's
	// business, once no init listens on it.
	ln.SetUnlinkOnClose(false)
	defer ln.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("jail: control socket: %w", err)
	}
	f, err := ln.File()
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("jail: control socket: %w", err)
	}
	return f, nil
}

// removeStale removes a control socket no init listens on any more (a jail
// that ended without removing it, a reboot); a live one is an error.
func removeStale(path string) error {
	c, err := dialControl(path)
	if err == nil {
		c.Close()
		return fmt.Errorf("jail: a jail already listens at %s", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("jail: remove a stale control socket: %w", err)
	}
	return nil
}

// Alive reports whether a jail listens at the control path. It takes
// nothing over: the attached caller stays attached.
func Alive(path string) bool {
	c, err := dialControl(path)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func dialControl(path string) (*net.UnixConn, error) {
	name, done, err := sockName(path)
	if err != nil {
		return nil, err
	}
	defer done()
	return net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: name, Net: "unixpacket"})
}

// sockName is a name for the unix socket at path that fits in a socket
// address (108 bytes): path itself, or for a longer one the same file
// through a descriptor of its directory, which done closes.
func sockName(path string) (name string, done func(), err error) {
	if len(path) < 100 {
		return path, func() {}, nil
	}
	dir, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", dir, filepath.Base(path)), func() { unix.Close(dir) }, nil
}

// Attach connects to the running jail whose Spec.Control is path and takes
// it over from its previous caller: relay connections, the program's
// output (to output) and its exit come here from now on. The jail's Tag
// says which jail it is.
func Attach(path string, output io.Writer) (*Jail, error) {
	c, err := dialControl(path)
	if err != nil {
		return nil, err
	}
	// The init's pid as this process sees it (it is 1 in its own PID
	// namespace): the kernel attaches the sender's credentials to its
	// greeting (the socket's listener was bound by the jail's first
	// caller, so SO_PEERCRED would name that one).
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) })
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, maxPacket)
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	_, err = c.Write([]byte{msgAttach})
	n, oobn, pid := 0, 0, 0
	if err == nil {
		n, oobn, _, _, err = c.ReadMsgUnix(buf, oob)
	}
	// Later messages carry descriptors, and no credentials.
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 0) })
	}
	if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
		for _, m := range msgs {
			if cred, perr := unix.ParseUnixCredentials(&m); perr == nil {
				pid = int(cred.Pid)
			}
		}
	}
	if err != nil || n == 0 || buf[0] != msgHello {
		c.Close()
		if err == nil {
			err = errors.New("no greeting")
		}
		return nil, fmt.Errorf("jail: attach %s: %w", path, err)
	}
	c.SetReadDeadline(time.Time{})
	j := &Jail{conn: c, conns: make(chan accepted), done: make(chan struct{}), control: true,
		tag: string(buf[1:n]), pid: pid, output: output, exit: -1, gone: make(chan struct{})}
	go j.read(j.gone)
	go j.removeWhenDone(jailCgroups(pid))
	return j, nil
}

// read receives the init's messages until the connection ends (without
// Control, with the init). stop closes when nobody takes relay connections
// any more: the init reaped, or Detach.
func (j *Jail) read(stop <-chan struct{}) {
	defer close(j.conns)
	if j.control {
		defer close(j.done)
		defer j.conn.Close()
	}
	buf := make([]byte, maxPacket)
	// Room for credentials too: messages sent right after the greeting
	// may still carry them (see Attach).
	oob := make([]byte, unix.CmsgSpace(4)+unix.CmsgSpace(unix.SizeofUcred))
	for {
		n, oobn, _, _, err := j.conn.ReadMsgUnix(buf, oob)
		if err != nil || (n == 0 && oobn == 0) {
			return
		}
		var fd = -1
		if oobn > 0 {
			if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					fds, _ := unix.ParseUnixRights(&m)
					for _, f := range fds {
						if fd < 0 {
							fd = f
						} else {
							unix.Close(f)
						}
					}
				}
			}
		}
		switch {
		case n == 2 && buf[0] == msgRelay && fd >= 0:
			f := os.NewFile(uintptr(fd), "relay")
			c, err := net.FileConn(f)
			f.Close()
			if err != nil {
				continue
			}
			select {
			case j.conns <- accepted{buf[1], c}:
			case <-stop:
				c.Close()
				return
			}
			continue
		case n > 0 && buf[0] == msgOutput && j.control:
			if j.output != nil {
				j.output.Write(buf[1:n])
			}
		case n > 1 && buf[0] == msgExit && j.control:
			if code, err := strconv.Atoi(string(buf[1:n])); err == nil {
				j.mu.Lock()
				j.exit = code
				j.mu.Unlock()
			}
		}
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// Detach lets go of a Control jail without stopping it: it runs on, for
// Spec.Orphan, until a caller attaches again.
func (j *Jail) Detach() {
	j.detach.Do(func() { close(j.gone) })
	if j.conn != nil {
		j.conn.Close()
	}
}

// Signal sends sig to the program (a Control jail's init passes it on, as
// an init started here does with the signals it receives).
func (j *Jail) Signal(sig syscall.Signal) error {
	if j.control {
		_, err := j.conn.Write([]byte{msgSignal, byte(sig)})
		return err
	}
	return j.Process.Signal(sig)
}

// SetOrphan changes a Control jail's Spec.Orphan: the caller attached now
// decides how long the jail runs on without it.
func (j *Jail) SetOrphan(d time.Duration) error {
	if !j.control || d < 0 {
		return errors.New("jail: no control socket, or a negative orphan timeout")
	}
	_, err := j.conn.Write([]byte(fmt.Sprintf("%c%d", msgOrphan, int64(d))))
	return err
}

// Kill ends the jail and everything in it at once.
func (j *Jail) Kill() {
	if j.control {
		j.conn.Write([]byte{msgKill})
	}
	if j.Process != nil {
		j.Process.Kill()
	}
}

// startHint names the kernel feature behind a failed clone.
func startHint(err error) string {
	switch {
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return " (creating namespaces was refused: run the gateway as root, or allow unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces>0, or an AppArmor profile that permits them)"
	case errors.Is(err, syscall.EINVAL):
		return " (the kernel lacks a namespace type: it needs user, mount, PID, network, IPC and UTS namespaces)"
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EUSERS):
		return " (the namespace limit is reached: raise user.max_user_namespaces)"
	}
	return ""
}

// Accept returns the next connection a program made to a relay, with the
// relay's kind. It fails once the jail has exited (or, with Control, once
// this caller is no longer attached).
func (j *Jail) Accept() (kind byte, c net.Conn, err error) {
	if j.conns == nil {
		return 0, nil, errors.New("jail: no relays")
	}
	a, ok := <-j.conns
	if !ok {
		return 0, nil, errors.New("jail: relays closed")
	}
	return a.kind, a.c, nil
}

// Probe builds a jail like spec's (without running its program) and
// reports whether this machine can: the error names the missing kernel
// feature and the remedy.
func Probe(spec Spec) error {
	spec.Probe = true
	var stderr strings.Builder
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			stderr.Write(buf[:n])
			if err != nil {
				break
			}
		}
		close(done)
	}()
	j, err := Start(spec, Options{Stderr: w})
	w.Close()
	if err != nil {
		r.Close()
		<-done
		return err
	}
	st, _ := j.Wait()
	<-done
	r.Close()
	if st == nil || !st.Success() {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = fmt.Sprintf("jail init exited: %v", st)
		}
		return errors.New(msg)
	}
	return nil
}
