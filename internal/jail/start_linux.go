package jail

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// wire is what the caller sends the init on descriptor 3.
type wire struct {
	Spec
	Privileged bool `json:"privileged"`
	// Descriptors is how many descriptors, from fdFirst on, are the program's.
	Descriptors int `json:"descriptors"`
}

// Start starts the jail's init. The program starts once the init has built
// the jail; if the init cannot build it, it exits with status 126 and says
// why on Stderr (see Probe for a check with a readable error).
func Start(spec Spec, o Options) (*Jail, error) {
	if err := spec.check(); err != nil {
		return nil, err
	}
	w := wire{Spec: spec, Privileged: os.Geteuid() == 0 && !spec.UserNS, Descriptors: len(o.Files)}
	if w.Privileged && (spec.UID <= 0 || spec.GID <= 0) {
		return nil, errors.New("jail: a root caller must name the program's unprivileged uid and gid")
	}
	payload, err := json.Marshal(w)
	if err != nil {
		return nil, err
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer specR.Close()
	var relayEnd *os.File
	var relays *net.UnixConn
	if len(spec.Relays) > 0 {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			specW.Close()
			return nil, fmt.Errorf("jail: relay socket: %w", err)
		}
		mine := os.NewFile(uintptr(fds[0]), "jail-relays")
		relayEnd = os.NewFile(uintptr(fds[1]), "jail-relays-init")
		defer relayEnd.Close()
		c, err := net.FileConn(mine)
		mine.Close()
		if err != nil {
			specW.Close()
			return nil, fmt.Errorf("jail: relay socket: %w", err)
		}
		relays = c.(*net.UnixConn)
	}
	cmd := &exec.Cmd{
		// The init is this very binary, whatever has become of its path.
		Path:       "/proc/self/exe",
		Args:       []string{InitArg0},
		Env:        []string{},
		ExtraFiles: append([]*os.File{specR, relayEnd}, o.Files...),
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
			// No jail outlives its caller.
			Pdeathsig: syscall.SIGKILL,
			Setpgid:   true,
		},
	}
	if o.Stdout != nil {
		cmd.Stdout = o.Stdout
	}
	if o.Stderr != nil {
		cmd.Stderr = o.Stderr
	}
	if !w.Privileged {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
	}
	if err := cmd.Start(); err != nil {
		specW.Close()
		if relays != nil {
			relays.Close()
		}
		return nil, fmt.Errorf("jail: start: %w%s", err, startHint(err))
	}
	go func() {
		specW.Write(payload)
		specW.Close()
	}()
	j := &Jail{Process: cmd.Process, relays: relays, done: make(chan struct{})}
	go func() {
		j.err = cmd.Wait()
		j.state = cmd.ProcessState
		if relays != nil {
			relays.Close()
		}
		close(j.done)
	}()
	return j, nil
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
// relay's kind. It fails once the jail has exited.
func (j *Jail) Accept() (kind byte, c net.Conn, err error) {
	if j.relays == nil {
		return 0, nil, errors.New("jail: no relays")
	}
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := j.relays.ReadMsgUnix(buf, oob)
		if err != nil {
			return 0, nil, err
		}
		if n == 0 && oobn == 0 {
			return 0, nil, errors.New("jail: relays closed")
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			continue
		}
		fds, err := unix.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			for _, fd := range fds {
				unix.Close(fd)
			}
			continue
		}
		f := os.NewFile(uintptr(fds[0]), "relay")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil || n != 1 {
			continue
		}
		return buf[0], c, nil
	}
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
