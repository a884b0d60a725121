package jail

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The init takes over a binary started as InitArg0, before main runs.
func init() {
	if len(os.Args) > 0 && os.Args[0] == InitArg0 {
		runInit()
	}
}

// Descriptors the caller hands the init.
const (
	fdSpec    = 3
	fdRelays  = 4
	fdControl = 5 // the control socket's listener, bound by the caller
	fdFirst   = 6 // the program's descriptors 3, 4, … start here
)

// fail reports a step that could not be done and ends the init.
func fail(step string, err error, hint string) {
	if hint != "" {
		hint = " (" + hint + ")"
	}
	fmt.Fprintf(os.Stderr, "jail: %s: %v%s\n", step, err, hint)
	os.Exit(126)
}

func runInit() {
	// prctl settings are per thread: the program is started from this one.
	runtime.LockOSThread()
	var w wire
	f := os.NewFile(fdSpec, "spec")
	if err := json.NewDecoder(f).Decode(&w); err != nil {
		fail("read spec", err, "")
	}
	f.Close()
	if w.Control == "" && UnderGVisor() {
		// Its caller did not set it (UnderGVisor); the caller wrote the
		// spec just read, so it was alive a moment ago.
		unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0)
	}
	// The caller put this process in the jail's cgroups before it sent the
	// spec: they become the root of a cgroup namespace of the jail's own,
	// so /proc/self/cgroup names no cgroup of the host (the program, forked
	// from this locked thread, inherits it). gVisor's kernel has no host
	// cgroup to name, and refuses the namespace (EINVAL) in a sandbox that
	// never mounted its cgroupfs, as releases since 2023 do.
	if UnderGVisor() {
		// nothing to hide
	} else if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		fail("cgroup namespace", err, "the kernel needs cgroup namespaces (CONFIG_CGROUPS, Linux 4.6)")
	}
	s := &w.Spec
	// The init holds exactly what its caller meant to pass, whatever the
	// caller itself had inherited; the program gets 0–2 and its own files.
	keep := map[int]bool{fdRelays: len(s.Relays) > 0 || s.Control != "", fdControl: s.Control != ""}
	for i := range w.Descriptors {
		keep[fdFirst+i] = true
	}
	if err := closeInherited(keep); err != nil {
		fail("close inherited descriptors", err, "")
	}

	// The control socket was bound by the caller, in the host's network
	// namespace: its path shows in no /proc/net/unix inside the jail.
	var ctlLn *net.UnixListener
	if s.Control != "" {
		f := os.NewFile(fdControl, "control")
		ln, err := net.FileListener(f)
		f.Close()
		if err != nil {
			fail("control socket", err, "")
		}
		ctlLn = ln.(*net.UnixListener)
		// Removing it is the next caller's business (it knows the host path).
		ctlLn.SetUnlinkOnClose(false)
	}
	buildRoot(s)
	if err := unix.Sethostname([]byte(orDefault(s.Hostname, "intern"))); err != nil {
		fail("set host name", err, "")
	}
	if err := loopbackUp(); err != nil {
		fail("bring up loopback", err, "")
	}
	var lns []*net.TCPListener
	for _, r := range s.Relays {
		ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: r.Port})
		if err != nil {
			fail("relay listener", err, "")
		}
		lns = append(lns, ln)
	}

	// From here on the init holds no privilege it does not need: it runs
	// as the program's user, with none of the caller's groups.
	uid, gid := s.UID, s.GID
	if w.SubIDs {
		uid, gid = ProgramUID, ProgramUID
	}
	if w.Privileged || w.SubIDs {
		if err := unix.Setgroups(nil); err != nil {
			fail("drop groups", err, "")
		}
		if err := unix.Setresgid(gid, gid, gid); err != nil {
			fail("set gid", err, "")
		}
		if err := unix.Setresuid(uid, uid, uid); err != nil {
			fail("set uid", err, "")
		}
		// A change of credentials clears the parent-death signal: a jail
		// without Control still ends with its caller.
		if s.Control == "" {
			unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0)
		}
	}
	// No program of the jail gains privileges by exec (setuid binaries,
	// file capabilities), and none can read the init's memory.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fail("no_new_privs", err, "")
	}
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	if err := s.Limits.setRlimits(); err != nil {
		fail("limits", err, "")
	}
	if s.Probe {
		probeSeccomp(s)
		os.Exit(0)
	}

	ctl := &control{orphan: s.Orphan, tag: s.Tag, keep: ctlLn != nil}
	if len(lns) > 0 || ctlLn != nil {
		f := os.NewFile(fdRelays, "relays")
		rc, err := net.FileConn(f)
		f.Close()
		if err != nil {
			fail("relay socket", err, "")
		}
		ctl.attach(rc.(*net.UnixConn), false)
		for i, ln := range lns {
			go relay(ln, s.Relays[i].Kind, ctl)
		}
	}
	var out *os.File
	if ctlLn != nil {
		// The program's output goes to whichever caller is attached; with
		// none it is dropped (and counted), never left to block the
		// program or to break a pipe to a caller that is gone.
		// (Notify, not Ignore: an ignored signal stays ignored across
		// exec, and the program's own pipes must break as usual.)
		signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
		r, w, err := os.Pipe()
		if err != nil {
			fail("output pipe", err, "")
		}
		out = w
		ctl.drained = make(chan struct{})
		go ctl.forward(r)
	}

	pid := startProgram(s, w.Privileged || w.SubIDs, w.Descriptors, out)
	if out != nil {
		out.Close()
	}
	ctl.setPID(pid)
	if ctlLn != nil {
		go ctl.serve(ctlLn)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	go func() {
		for sig := range sigs {
			syscall.Kill(pid, sig.(syscall.Signal))
		}
	}()
	// As pid 1 the init reaps every orphan; its own exit kills the rest.
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			os.Exit(125)
		}
		if wpid != pid {
			continue
		}
		switch {
		case ws.Exited():
			ctl.exit(ws.ExitStatus())
		case ws.Signaled():
			ctl.exit(128 + int(ws.Signal()))
		}
	}
}

// relay hands every connection accepted on ln to the caller.
func relay(ln *net.TCPListener, kind byte, ctl *control) {
	for {
		c, err := ln.AcceptTCP()
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			// Out of descriptors for now (the program holds them): the
			// relay waits for some, it does not stop for good.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil {
			return
		}
		f, err := c.File()
		c.Close()
		if err != nil {
			continue
		}
		ctl.handOff(kind, f)
	}
}

// control is the init's side of its caller: the one attached, or, for a
// Control jail between two callers, none.
type control struct {
	orphan time.Duration
	tag    string
	keep   bool // a Control jail: it outlives its caller

	mu      sync.Mutex
	pid     int
	cur     *net.UnixConn
	gen     int
	waiting []waiting // relay connections made while no caller was attached
	dropped int64     // output bytes dropped while no caller was attached
	timer   *time.Timer
	drained chan struct{} // closed when the program's output has all been read
}

type waiting struct {
	kind byte
	f    *os.File
}

// maxWaiting bounds the relay connections held for the next caller.
const maxWaiting = 64

func (c *control) setPID(pid int) {
	c.mu.Lock()
	c.pid = pid
	c.mu.Unlock()
}

// serve takes each new caller of a Control jail: the newest one wins.
func (c *control) serve(ln *net.UnixListener) {
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		// Only a process outside the jail's PID namespace, with the
		// caller's user: nothing inside the jail (which cannot see the
		// path anyway) may take it over.
		ok := false
		if raw, err := conn.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
				ok = err == nil && cred.Pid == 0 && cred.Uid == 0
			})
		}
		if !ok {
			conn.Close()
			continue
		}
		go c.handshake(conn)
	}
}

// handshake attaches a caller that asks to (msgAttach); a connection that
// only checks the jail is alive (Alive) and closes takes nothing over.
func (c *control) handshake(conn *net.UnixConn) {
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if n, err := conn.Read(b[:]); err != nil || n != 1 || b[0] != msgAttach {
		conn.Close()
		return
	}
	conn.SetReadDeadline(time.Time{})
	c.attach(conn, true)
}

// attach makes conn the caller: it is greeted, then receives what waited.
func (c *control) attach(conn *net.UnixConn, greet bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil {
		c.cur.Close()
	}
	c.cur = conn
	c.gen++
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if greet {
		conn.Write(append([]byte{msgHello}, c.tag...))
	}
	if c.dropped > 0 {
		c.sendLocked([]byte(fmt.Sprintf("%cjail: %d bytes of output were dropped while no caller was attached\n", msgOutput, c.dropped)), nil)
		c.dropped = 0
	}
	for _, w := range c.waiting {
		c.sendLocked([]byte{msgRelay, w.kind}, w.f)
		w.f.Close()
	}
	c.waiting = nil
	go c.read(conn, c.gen)
}

// read follows the caller's requests until it goes away.
func (c *control) read(conn *net.UnixConn, gen int) {
	buf := make([]byte, 32)
	for {
		n, err := conn.Read(buf)
		if err != nil || n == 0 {
			break
		}
		c.mu.Lock()
		pid := c.pid
		if buf[0] == msgOrphan {
			if d, err := strconv.ParseInt(string(buf[1:n]), 10, 64); err == nil && d >= 0 {
				c.orphan = time.Duration(d)
			}
		}
		c.mu.Unlock()
		switch {
		case buf[0] == msgSignal && n == 2 && pid > 0:
			syscall.Kill(pid, syscall.Signal(buf[1]))
		case buf[0] == msgKill:
			os.Exit(137)
		}
	}
	c.mu.Lock()
	if c.gen == gen {
		c.lostLocked()
	}
	c.mu.Unlock()
}

// lostLocked notes that the caller is gone. A jail without Control has no
// way to the next one: its init dies with its caller (Pdeathsig).
func (c *control) lostLocked() {
	if c.cur != nil {
		c.cur.Close()
		c.cur = nil
	}
	if !c.keep || c.timer != nil {
		return
	}
	c.timer = time.AfterFunc(c.orphan, c.orphaned)
}

// orphaned stops the program of a jail no caller came back to.
func (c *control) orphaned() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil || c.pid == 0 {
		return
	}
	syscall.Kill(c.pid, syscall.SIGTERM)
	time.AfterFunc(5*time.Second, func() { os.Exit(137) })
}

// sendLocked sends one message; a failed send means the caller is gone.
func (c *control) sendLocked(msg []byte, f *os.File) bool {
	if c.cur == nil {
		return false
	}
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	if _, _, err := c.cur.WriteMsgUnix(msg, oob, nil); err != nil {
		c.lostLocked()
		return false
	}
	return true
}

// handOff gives a relay connection to the caller, or keeps it for the
// next one (a Control jail between callers), within a bound.
func (c *control) handOff(kind byte, f *os.File) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sendLocked([]byte{msgRelay, kind}, f) {
		f.Close()
		return
	}
	if c.keep && len(c.waiting) < maxWaiting {
		c.waiting = append(c.waiting, waiting{kind, f})
		return
	}
	f.Close()
}

// forward sends the program's output to the caller.
func (c *control) forward(r *os.File) {
	defer close(c.drained)
	buf := make([]byte, maxPacket-1)
	for {
		n, err := r.Read(buf[1:])
		if n > 0 {
			buf[0] = msgOutput
			c.mu.Lock()
			if !c.sendLocked(buf[:1+n], nil) {
				c.dropped += int64(n)
			}
			c.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// exit reports the program's status to the caller and ends the jail.
func (c *control) exit(code int) {
	if c.drained != nil {
		// What the program wrote last goes first (a process it left
		// behind may hold the pipe open: not for long).
		select {
		case <-c.drained:
		case <-time.After(time.Second):
		}
	}
	c.mu.Lock()
	c.sendLocked([]byte(fmt.Sprintf("%c%d", msgExit, code)), nil)
	os.Exit(code)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// startProgram starts the program with the descriptors the caller passed.
// out, when set, is its stdout and stderr instead of the init's.
func startProgram(s *Spec, privileged bool, nfiles int, out *os.File) int {
	argv0 := s.Argv[0]
	if !strings.Contains(argv0, "/") {
		argv0 = lookPath(argv0, s.Env)
	}
	files := []uintptr{0, 1, 2}
	if out != nil {
		files[1], files[2] = out.Fd(), out.Fd()
	}
	for i := range nfiles {
		files = append(files, uintptr(fdFirst+i))
	}
	sys := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setsid: true}
	if !privileged && s.View != "" {
		// A prepared view has no /proc, through which a fork writes a new
		// user namespace's maps: the program stays the init's user (0 of
		// the jail's namespace) and holds no capability, for good.
		if err := dropCapabilities(); err != nil {
			fail("drop capabilities", err, "")
		}
	} else if !privileged {
		// A user namespace of its own, as uid 1000: the program holds no
		// capability over the mounts the init made.
		sys.Cloneflags = syscall.CLONE_NEWUSER
		sys.UidMappings = []syscall.SysProcIDMap{{ContainerID: ProgramUID, HostID: 0, Size: 1}}
		sys.GidMappings = []syscall.SysProcIDMap{{ContainerID: ProgramUID, HostID: 0, Size: 1}}
		sys.Credential = &syscall.Credential{Uid: ProgramUID, Gid: ProgramUID, NoSetGroups: true}
	}
	path, argv := confineProgram(s, sys, argv0)
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{Dir: orDefault(s.Dir, "/"), Env: s.Env, Files: files, Sys: sys})
	if err != nil {
		fail("start "+s.Argv[0], err, "")
	}
	for _, fd := range files[3:] {
		unix.Close(int(fd))
	}
	return pid
}

// dropCapabilities empties this thread's capability sets, its bounding set
// (no exec can grant one back, not even as uid 0) and its ambient set; the
// program is forked from this thread.
func dropCapabilities() error {
	for c := 0; c <= 63; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("bounding set: %w", err)
		}
	}
	unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

func lookPath(name string, env []string) string {
	path := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return name
}

// buildRoot makes the jail's mount view and enters it. While it works the
// old root is at /oldroot and the new one at /newroot, on a scratch tmpfs
// that is detached at the end together with the old root.
func buildRoot(s *Spec) {
	must := func(step string, err error) {
		if err != nil {
			hint := ""
			if errors.Is(err, unix.EPERM) {
				hint = "the kernel refused a mount: inside a container, allow mount namespaces (e.g. unconfined seccomp/AppArmor) or run with --unsafe-shared-host"
			}
			fail(step, err, hint)
		}
	}
	if s.View != "" {
		// A view made ready: the init holds capabilities only in its own
		// user namespace and its program none (startProgram), so nothing
		// the program runs can chroot again to leave it.
		if len(s.Binds)+len(s.Files)+len(s.Symlinks)+len(s.Hide) > 0 {
			fail("enter the view", errors.New("binds, files, symlinks or hidden paths with a prepared view"), "")
		}
		must("enter the view", unix.Chroot(s.View))
		must("chdir /", os.Chdir("/"))
		return
	}
	// Nothing mounted here propagates back to the caller's view.
	must("make mounts private", unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""))
	must("scratch tmpfs", unix.Mount("tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700"))
	for _, d := range []string{"/tmp/oldroot", "/tmp/newroot", "/tmp/files"} {
		must("scratch dirs", os.Mkdir(d, 0o755))
	}
	if s.Inherit {
		must("bind the current root", unix.Mount("/", "/tmp/newroot", "", unix.MS_BIND|unix.MS_REC, ""))
		must("make the root read-only", setattr("/tmp/newroot", true, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID))
	} else {
		must("root tmpfs", unix.Mount("tmpfs", "/tmp/newroot", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"))
	}
	must("enter the scratch root", os.Chdir("/tmp"))
	must("pivot_root", unix.PivotRoot("/tmp", "/tmp/oldroot"))
	must("chdir /", os.Chdir("/"))

	// A private /tmp first: a bind may sit inside it.
	must("mkdir /tmp", os.MkdirAll("/newroot/tmp", 0o1777))
	must("mount /tmp", unix.Mount("tmpfs", "/newroot/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, s.Limits.tmpfsData("1777")))
	for _, b := range s.Binds {
		must("bind "+b.Dst, bind(b))
	}
	if !s.Inherit {
		must("/dev", makeDev(s.Limits.tmpfsData("1777")))
	}
	must("mkdir /proc", os.MkdirAll("/newroot/proc", 0o555))
	if err := unix.Mount("proc", "/newroot/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		fail("mount /proc", err, "a /proc with masked paths, as in some containers, keeps a new /proc from being mounted: give the container an unmasked /proc or run with --unsafe-shared-host")
	}
	for i, f := range s.Files {
		must("file "+f.Dst, writeFile(i, f))
	}
	links := make([]string, 0, len(s.Symlinks))
	for p := range s.Symlinks {
		links = append(links, p)
	}
	sort.Strings(links)
	for _, p := range links {
		dst := "/newroot" + p
		must("symlink "+p, os.MkdirAll(filepath.Dir(dst), 0o755))
		if err := os.Symlink(s.Symlinks[p], dst); err != nil && !errors.Is(err, os.ErrExist) {
			must("symlink "+p, err)
		}
	}
	for _, p := range hidden(s) {
		must("hide "+p, hide("/newroot"+p))
	}

	// Enter the new root and let go of everything else.
	must("enter the new root", os.Chdir("/newroot"))
	must("pivot_root", unix.PivotRoot(".", "."))
	must("detach the old root", unix.Unmount(".", unix.MNT_DETACH))
	must("chdir /", os.Chdir("/"))
	if !s.Inherit {
		must("make / read-only", setattr("/", false, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV))
	}
}

func setattr(path string, recursive bool, attr uint64) error {
	flags := uint(0)
	if recursive {
		flags = unix.AT_RECURSIVE
	}
	return unix.MountSetattr(unix.AT_FDCWD, path, flags, &unix.MountAttr{Attr_set: attr})
}

// bind mounts one Bind; a symlink source with Src == Dst is recreated as
// the same symlink (merged /usr: /bin → usr/bin).
func bind(b Bind) error {
	src, dst := "/oldroot"+b.Src, "/newroot"+b.Dst
	if b.Copy {
		return copyTree(src, dst, b.Optional)
	}
	lst, err := os.Lstat(src)
	if err != nil {
		if b.Optional && errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if lst.Mode()&os.ModeSymlink != 0 && b.Src == b.Dst {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.Symlink(target, dst)
	}
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := mountPoint(dst, st.IsDir()); err != nil {
		return err
	}
	// Mounted elsewhere than its host path: not named in mountinfo (a
	// kernel without overlays by descriptor gets the plain bind).
	if b.Src != b.Dst && bindUnnamed(b, src, dst, st.IsDir()) == nil {
		return nil
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if !b.Writable {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	return setattr(dst, true, attr)
}

// mountPoint creates an empty directory or file to mount on.
func mountPoint(dst string, dir bool) error {
	if dir {
		return os.MkdirAll(dst, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// makeDev builds a minimal /dev: the harmless character devices, the
// usual links, a private pty instance and a private /dev/shm.
func makeDev(shm string) error {
	if err := os.MkdirAll("/newroot/dev", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", "/newroot/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return err
	}
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		src, dst := "/oldroot/dev/"+d, "/newroot/dev/"+d
		if _, err := os.Stat(src); err != nil {
			continue
		}
		if err := mountPoint(dst, false); err != nil {
			return err
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"} {
		if err := os.Symlink(target, "/newroot/dev/"+name); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir("/newroot/dev/"+d, 0o755); err != nil {
			return err
		}
	}
	// Terminals are optional: some agents' tools want one.
	unix.Mount("devpts", "/newroot/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
	return unix.Mount("tmpfs", "/newroot/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, shm)
}

// writeFile puts a File's content at its place, read-only: written to the
// scratch tmpfs, then bound over the destination (which may sit inside a
// read-only bind).
func writeFile(i int, f File) error {
	tmp := "/files/" + strconv.Itoa(i)
	if err := os.WriteFile(tmp, []byte(f.Content), 0o644); err != nil {
		return err
	}
	dst := "/newroot" + f.Dst
	if err := mountPoint(dst, false); err != nil {
		return err
	}
	if err := unix.Mount(tmp, dst, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return setattr(dst, false, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
}

// ownMounts are the jail's own file systems: nothing of the host shows
// in them but the binds made inside them.
var ownMounts = []string{"/tmp", "/dev", "/proc"}

// hidden is what of s.Hide to cover. A path in one of the jail's own
// mounts (a binary kept in /tmp has its directory, /tmp, hidden) shows
// nothing of the host there: covering it would take the jail's /tmp
// away. Only the binds inside it are covered then.
func hidden(s *Spec) []string {
	var out []string
	under := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	for _, p := range s.Hide {
		p = filepath.Clean(p)
		own := false
		for _, m := range ownMounts {
			if under(p, m) && !(m == "/dev" && s.Inherit) {
				own = true
			}
		}
		for _, b := range s.Binds {
			if under(p, filepath.Clean(b.Dst)) {
				own = false // under a bind: the host's
			}
		}
		if !own {
			out = append(out, p)
			continue
		}
		for _, b := range s.Binds {
			if dst := filepath.Clean(b.Dst); under(dst, p) {
				out = append(out, dst)
			}
		}
	}
	return out
}

// hide covers a path that exists in the new root with an empty read-only
// directory (or an empty file).
func hide(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return nil
	}
	if st.IsDir() {
		return unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555")
	}
	empty := "/files/empty"
	if err := os.WriteFile(empty, nil, 0o444); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := unix.Mount(empty, p, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return setattr(p, false, unix.MOUNT_ATTR_RDONLY)
}

// loopbackUp brings up lo in the new network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	if ifr.Uint16()&unix.IFF_UP != 0 {
		// gVisor's netstack makes a namespace's loopback up, and sets no
		// interface flags.
		return nil
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
