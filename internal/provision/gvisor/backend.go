// Package gvisor is the fleet backend of interns on this machine behind a
// second wall: each awake intern's daemon and agent run in a gVisor
// sandbox of its own (runsc, one sandbox per intern), an application
// kernel in user space that serves their system calls, so that the host
// kernel is reached only through the Sentry's few dozen calls under its own
// filter. The sandbox holds what the namespace jail holds (localjail's
// DaemonJail: system directories read-only, /intern writable, the relays as
// the only ways out) and is bounded by a cgroup of its own holding the
// Sentry, its netstack and the gofer. Sleep ends the sandbox and keeps
// <data-dir>/interns/<id>. ADR 0981.
package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/spawn"
)

// Name is this backend's, as rows record it.
const Name = "gvisor"

// Backend runs interns' daemons in gVisor sandboxes on this machine.
type Backend struct {
	// Jail is what each sandbox holds: the namespace jail's backend of the
	// same settings (DataDir, Command, Agents, Jail), whose DaemonJail it
	// is; that backend itself starts nothing.
	Jail *localjail.Backend
	// Runsc is the runsc binary; Platform its --platform (empty: runsc's
	// own default, systrap since 2023, ptrace on Debian's 2022 release).
	Runsc, Platform string
	// Init is the host path of the sandboxes' init: a binary that links
	// this package (the gateway's own; default: this executable).
	Init string
	// StartTimeout bounds a sandbox's start until its daemon listens
	// (default 30 s).
	StartTimeout time.Duration

	log     *slog.Logger
	changed func()
	route   func(addr, path string) (undo func())

	mu      sync.Mutex
	daemons map[string]*daemon
	closed  bool
}

var _ provision.Backend = (*Backend)(nil)

// daemon is one intern's running sandbox.
type daemon struct {
	id, runs    string
	url, secret string
	cmd         *exec.Cmd
	// listeners are the relays' host sockets and the daemon's forwarder.
	listeners []net.Listener
	unroute   func() // the gateway's route to the daemon's socket
	since     time.Time
	ended     chan struct{}
	stopping  bool // guarded by Backend.mu
}

func (*Backend) Name() string { return Name }

// stateDir is runsc's --root: the sandboxes' state, in the data directory.
func (b *Backend) stateDir() string { return b.abs(filepath.Join(b.Jail.DataDir, "gvisor", "state")) }

// sandbox is where the intern's bundle and sockets are: under the
// temporary directory, since a unix socket's path is short (108 bytes) and
// a data directory's need not be; named by hashes of the data directory
// and the intern, root's alone.
func (b *Backend) sandbox(id string) sandbox {
	return sandbox{dir: filepath.Join(os.TempDir(), "cohort-gvisor-"+shortHash(b.abs(b.Jail.DataDir)), shortHash(id))}
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}

func (b *Backend) internDir(id string) string {
	return b.abs(filepath.Join(b.Jail.DataDir, "interns", id))
}

func (*Backend) abs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// containerID is the intern's sandbox as runsc names it: its sockets are
// the host's (abstract), so the name is unique to this data directory too.
func (b *Backend) containerID(id string) string {
	return "cohort-" + shortHash(b.abs(b.Jail.DataDir)) + "-" + id
}

// runsc is a runsc command on this backend's state.
func (b *Backend) runsc(args ...string) *exec.Cmd {
	all := append(platformArgs(b.Platform), "--root", b.stateDir(), "--network=none", "--host-uds=all")
	return exec.Command(b.Runsc, append(all, args...)...)
}

// Open ends the sandboxes a previous gateway left: their relays were that
// gateway's, and a sandbox is not adopted (ADR 0981).
func (b *Backend) Open(ctx context.Context, h provision.Host) error {
	b.mu.Lock()
	b.log, b.changed, b.route = h.Log, h.Changed, h.Route
	if b.route == nil {
		b.route = func(string, string) func() { return nil }
	}
	if b.daemons == nil {
		b.daemons = map[string]*daemon{}
	}
	b.mu.Unlock()
	if err := os.MkdirAll(b.stateDir(), 0o700); err != nil {
		return err
	}
	for _, cid := range b.leftovers() {
		b.log.Info("intern's sandbox from a previous gateway stopped", "sandbox", cid)
		b.destroy(cid)
	}
	return nil
}

// leftovers are the sandboxes runsc knows of in the state directory.
func (b *Backend) leftovers() []string {
	out, err := b.runsc("list", "--format=json").Output()
	if err != nil {
		return nil
	}
	var list []struct {
		ID string `json:"id"`
	}
	json.Unmarshal(out, &list)
	var ids []string
	for _, c := range list {
		ids = append(ids, c.ID)
	}
	return ids
}

// destroy kills the sandbox and removes runsc's state of it.
func (b *Backend) destroy(cid string) {
	b.runsc("kill", "--all", cid, "KILL").Run()
	b.runsc("delete", "--force", cid).Run()
}

// Observe lists the sandboxes this gateway runs.
func (b *Backend) Observe() ([]provision.Observed, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]provision.Observed, 0, len(b.daemons))
	for _, d := range b.daemons {
		out = append(out, provision.Observed{ID: d.id, Running: true, Ready: true, URL: d.url, Runs: d.runs, Since: d.since})
	}
	return out, true
}

// Fingerprint is what a sandbox is started with from the row.
func (b *Backend) Fingerprint(s provision.Spec) string { return b.Jail.Fingerprint(s) }

// Claim: only this gateway sees this machine's sandboxes.
func (*Backend) Claim(context.Context, string) (func(), error) { return func() {}, nil }

// Ensure keeps the intern's sandbox if it runs spec with spec.Secret, and
// otherwise replaces it with a new one.
func (b *Backend) Ensure(ctx context.Context, spec provision.Spec) (provision.Daemon, error) {
	dir := b.internDir(spec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return provision.Daemon{}, err
	}
	runs := b.Fingerprint(spec)
	b.mu.Lock()
	d := b.daemons[spec.ID]
	b.mu.Unlock()
	if d != nil {
		if d.runs == runs && spec.Secret != "" && d.secret == spec.Secret {
			return b.running(d), nil
		}
		b.stop(d)
	}
	secret, _, err := spec.Mint(ctx)
	if err != nil {
		return provision.Daemon{}, err
	}
	d, err = b.start(ctx, spec, dir, secret, runs)
	if err != nil {
		return provision.Daemon{}, fmt.Errorf("start sandbox: %w", err)
	}
	return b.running(d), nil
}

func (b *Backend) running(d *daemon) provision.Daemon {
	return provision.Daemon{URL: d.url, Secret: d.secret, Log: []any{"pid", d.cmd.Process.Pid, "sandbox", "gvisor"}}
}

// DaemonJail is the jail the intern's sandbox holds.
func (b *Backend) DaemonJail(spec provision.Spec, dir string) (localjail.DaemonJail, error) {
	self := b.Jail.Command
	if len(self) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return localjail.DaemonJail{}, err
		}
		self = []string{exe}
	}
	return b.Jail.DaemonJail(spec.ID, spec.Model, spec.Agent, spec.Limits, dir, self)
}

func (b *Backend) init() (string, error) {
	if b.Init != "" {
		return b.Init, nil
	}
	return os.Executable()
}

// start writes the intern's bundle, opens its relays' host sockets and
// runs its sandbox until the daemon listens.
func (b *Backend) start(ctx context.Context, spec provision.Spec, dir, secret, runs string) (*daemon, error) {
	dj, err := b.DaemonJail(spec, dir)
	if err != nil {
		return nil, err
	}
	js := dj.Spec()
	if err := ownDir(dir, js.UID, js.GID); err != nil {
		return nil, fmt.Errorf("give the intern's directory to its sandbox: %w", err)
	}
	init, err := b.init()
	if err != nil {
		return nil, err
	}
	// No sandbox of this name is left: watch deletes each as it ends, Open
	// those a previous gateway left, and a failed start its own (two runsc
	// runs saved on every wake).
	cid := b.containerID(spec.ID)
	sb := b.sandbox(spec.ID)
	if err := sb.write(js, init, "/cohort-gvisor/"+cid); err != nil {
		return nil, err
	}
	d := &daemon{id: spec.ID, runs: runs, secret: secret, ended: make(chan struct{})}
	closeAll := func() {
		for _, l := range d.listeners {
			l.Close()
		}
	}
	for _, r := range js.Relays {
		ln, err := listenUnix(relaySock(sb.relays(), r.Kind))
		if err != nil {
			closeAll()
			return nil, err
		}
		d.listeners = append(d.listeners, ln)
		go serveRelay(ln, spec.ID, r.Kind, dj)
	}
	logR, logW, err := os.Pipe()
	if err != nil {
		closeAll()
		return nil, err
	}
	go func() {
		localjail.ForwardLogs(b.log, spec.ID, logR)
		logR.Close()
	}()
	cmd := b.runsc("run", "--bundle", sb.bundle(), cid)
	// The secret goes to the init's stdin, never to its environment or
	// command line.
	cmd.Stdin = strings.NewReader(secret)
	cmd.Stdout, cmd.Stderr = logW, logW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = spawn.Start(cmd)
	logW.Close()
	if err != nil {
		closeAll()
		return nil, err
	}
	d.cmd = cmd
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fail := func(err error) (*daemon, error) {
		closeAll()
		b.destroy(cid)
		cmd.Process.Kill()
		<-exited
		return nil, err
	}
	if err := b.awaitDaemon(ctx, sb.daemonSock(), exited); err != nil {
		return fail(err)
	}
	fwd, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return fail(err)
	}
	d.listeners = append(d.listeners, fwd)
	go bridge(fwd, sb.daemonSock())
	d.url = "http://" + fwd.Addr().String()
	// This gateway dials the socket itself: the forwarder is for anything
	// else given the daemon's address (ADR 0986).
	d.unroute = b.route(fwd.Addr().String(), sb.daemonSock())
	b.watch(d, exited)
	return d, nil
}

// awaitDaemon waits until the daemon's socket answers, the sandbox ends or
// the start times out.
func (b *Backend) awaitDaemon(ctx context.Context, sock string, exited chan error) error {
	timeout := b.StartTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("the sandbox ended before its daemon listened: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return errors.New("the sandbox's daemon did not listen in time")
		case <-tick.C:
		}
	}
}

// watch registers d and follows it until its sandbox ends: one that ends
// on its own is reported to the reconciler, which restarts it.
func (b *Backend) watch(d *daemon, exited chan error) {
	d.since = time.Now()
	b.mu.Lock()
	b.daemons[d.id] = d
	b.mu.Unlock()
	go func() {
		err := <-exited
		if d.unroute != nil {
			d.unroute()
		}
		for _, l := range d.listeners {
			l.Close()
		}
		b.destroy(b.containerID(d.id))
		b.mu.Lock()
		if b.daemons[d.id] == d {
			delete(b.daemons, d.id)
		}
		quiet := d.stopping || b.closed
		b.mu.Unlock()
		close(d.ended)
		if quiet {
			b.log.Info("intern daemon stopped", "intern", d.id)
			return
		}
		b.log.Error("intern daemon exited", "intern", d.id, "err", err)
		b.changed()
	}()
}

// stop ends d: SIGTERM, which runsc passes to the sandbox's init and it to
// the daemon (its runs cancelled, its agent stopped); after 5 s the
// sandbox is killed.
func (b *Backend) stop(d *daemon) {
	b.mu.Lock()
	d.stopping = true
	b.mu.Unlock()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.ended:
	case <-time.After(5 * time.Second):
		b.destroy(b.containerID(d.id))
		d.cmd.Process.Kill()
		<-d.ended
	}
}

// Sleep ends the intern's sandbox; its directory stays.
func (b *Backend) Sleep(ctx context.Context, id string) error {
	b.mu.Lock()
	d := b.daemons[id]
	b.mu.Unlock()
	if d != nil {
		b.stop(d)
	}
	return nil
}

// Remove ends the intern's sandbox and removes its directories.
func (b *Backend) Remove(ctx context.Context, id string) error {
	b.Sleep(ctx, id)
	return errors.Join(os.RemoveAll(b.sandbox(id).dir), jail.RemoveAll(b.internDir(id)))
}

// Close stops every sandbox, all at once: their relays are this gateway's.
func (b *Backend) Close() {
	b.mu.Lock()
	b.closed = true
	var ds []*daemon
	for _, d := range b.daemons {
		ds = append(ds, d)
	}
	b.daemons = map[string]*daemon{}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.stop(d)
		}()
	}
	wg.Wait()
	b.unpinNetNS()
}

// unpinNetNS undoes what releases since 2023 leave in the state directory:
// a bind mount pinning an empty network namespace for their gofers, which
// would keep the data directory from being removed; runsc makes it again
// on the next start. (Mounts stack when sandboxes start at once: all go.)
func (b *Backend) unpinNetNS() {
	for unix.Unmount(filepath.Join(b.stateDir(), "null-netns"), unix.MNT_DETACH) == nil {
	}
}

// DaemonPID is the pid of the intern's `runsc run` on the host, or 0.
func (b *Backend) DaemonPID(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := b.daemons[id]; d != nil {
		return d.cmd.Process.Pid
	}
	return 0
}

// ownDir gives the intern's directory (with a home in it) to its
// sandbox's user, when it is not already theirs.
func ownDir(dir string, uid, gid int) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if s, ok := st.Sys().(*syscall.Stat_t); ok && int(s.Uid) == uid {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(dir, "home"), 0o700); err != nil {
		return err
	}
	return jail.Chown(dir, uid, gid)
}

// listenUnix listens on a host socket the sandbox's user may connect to
// (its directory is root's alone on the host).
func listenUnix(path string) (net.Listener, error) {
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// serveRelay serves the connections of one relay kind of the intern's
// sandbox, as the namespace jail's are served: each counted against the
// intern's cap by the relay, a third-party agent's model connections sent
// to its own endpoint.
func serveRelay(ln net.Listener, id string, kind byte, dj localjail.DaemonJail) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if kind == localjail.KindModel && dj.Upstream != "" {
			go dj.Relay.ServeModel(id, c, dj.Upstream, dj.UpstreamKey)
			continue
		}
		go dj.Relay.Serve(id, kind, c)
	}
}
