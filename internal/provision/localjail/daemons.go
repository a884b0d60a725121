// Package localjail is the fleet backend of interns on this machine: each
// awake intern's daemon runs in a jail of its own (its own user, mount
// view, PIDs and network namespace whose only ways out are the relays), or,
// with --unsafe-shared-host (Jail nil), as a plain child of the gateway.
// Its data directory is <data-dir>/interns/<id>; sleep ends the jail and
// keeps the directory. Jails may outlive their gateway (JailConfig.Orphan)
// for the next one to adopt.
package localjail

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/spawn"
)

// Name is this backend's, as rows record it.
const Name = "local"

// Backend runs interns' daemons on this machine, jailed unless Jail is nil.
type Backend struct {
	// DataDir is the gateway's data directory; daemons live under
	// <DataDir>/interns/<id>, jails' control sockets under <DataDir>/jails.
	DataDir string
	// Command runs `cohort intern`: the gateway's --intern-binary
	// (InternBinary), which is also each jail's init; default: this
	// executable.
	Command []string
	// GatewayURL, when set, is passed to unjailed daemons as --gateway-url:
	// where their http_request tool reaches the vault (a jail's relay
	// reaches it otherwise).
	GatewayURL string
	// Agents is what an intern's agent name runs.
	Agents provision.Agents
	// InteractionDeadline, when set, is passed to daemons as
	// --interaction-deadline.
	InteractionDeadline time.Duration
	// HTTPToolCAFile, when set, is PEM the daemons' http_request trusts
	// besides the system roots (a jail gets its content, read-only).
	HTTPToolCAFile string
	// StartTimeout bounds an unjailed daemon's report of its address
	// (default 30 s).
	StartTimeout time.Duration
	// Jail, when set, runs each daemon in a jail of its own (what serve
	// does unless --unsafe-shared-host); nil runs them as plain children
	// on the gateway's host.
	Jail *JailConfig

	log     *slog.Logger
	changed func()
	check   func(ctx context.Context, url, secret string) error

	mu      sync.Mutex
	daemons map[string]*daemon
	closed  bool
}

var _ provision.Backend = (*Backend)(nil)

// daemon is one intern's daemon: started here, or a jail a previous
// gateway left (proc nil until adopted or stopped).
type daemon struct {
	id, runs    string
	url, secret string
	proc        daemonProc
	since       time.Time
	ended       chan struct{}
	stopping    bool // guarded by Backend.mu
}

func (*Backend) Name() string { return Name }

func (b *Backend) startTimeout() time.Duration {
	if b.StartTimeout > 0 {
		return b.StartTimeout
	}
	return 30 * time.Second
}

// Open finds the jails a previous gateway left running: the reconciler
// adopts those whose interns still run, and has the others stopped.
func (b *Backend) Open(ctx context.Context, h provision.Host) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log, b.changed, b.check = h.Log, h.Changed, h.Check
	if b.daemons == nil {
		b.daemons = map[string]*daemon{}
	}
	if b.Jail != nil {
		for _, id := range b.aliveJails() {
			if b.daemons[id] == nil {
				b.daemons[id] = &daemon{id: id, ended: make(chan struct{})}
			}
		}
	}
	return nil
}

// Observe lists the daemons of this machine; a jail left by a previous
// gateway is running but not ready (nor known to run anything) until
// adopted.
func (b *Backend) Observe() ([]provision.Observed, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]provision.Observed, 0, len(b.daemons))
	for _, d := range b.daemons {
		out = append(out, provision.Observed{ID: d.id, Running: true, Ready: d.proc != nil, URL: d.url, Runs: d.runs, Since: d.since})
	}
	return out, true
}

// Fingerprint is what a jail is started with from the row: its model,
// agent and limits.
func (*Backend) Fingerprint(s provision.Spec) string {
	return fmt.Sprintf("%s\x00%s\x00%+v", s.Model, s.Agent, s.Limits)
}

// Claim: only this gateway sees this machine's daemons.
func (*Backend) Claim(context.Context, string) (func(), error) { return func() {}, nil }

// Ensure keeps the intern's daemon if it runs spec with spec.Secret,
// adopts a jail a previous gateway left that does, and otherwise replaces
// either with a new daemon (one at a time on a data directory).
func (b *Backend) Ensure(ctx context.Context, spec provision.Spec) (provision.Daemon, error) {
	dir := b.internDir(spec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return provision.Daemon{}, err
	}
	runs := b.Fingerprint(spec)
	b.mu.Lock()
	d := b.daemons[spec.ID]
	b.mu.Unlock()
	if d != nil && d.proc != nil {
		if d.runs == runs && spec.Secret != "" && d.secret == spec.Secret {
			return b.running(d, false), nil
		}
		// The model, the agent or the limits changed (or the secret: the
		// row was rewritten): the daemon restarts with the new ones.
		b.stop(d)
	}
	// The daemon's log lines (and a jail's own errors) join the gateway's.
	logR, logW, err := os.Pipe()
	if err != nil {
		return provision.Daemon{}, err
	}
	go forwardLogs(b.log, spec.ID, logR)
	if d != nil && d.proc == nil {
		proc, err := b.adopt(ctx, spec, dir, logW)
		if err != nil {
			logW.Close()
			return provision.Daemon{}, err
		}
		b.mu.Lock()
		if b.daemons[spec.ID] == d {
			delete(b.daemons, spec.ID)
		}
		b.mu.Unlock()
		if proc != nil {
			nd := &daemon{id: spec.ID, runs: runs, url: spec.URL, secret: spec.Secret, proc: proc}
			b.watch(nd, logW)
			return b.running(nd, true), nil
		}
	}
	secret, _, err := spec.Mint(ctx)
	if err != nil {
		logW.Close()
		return provision.Daemon{}, err
	}
	var proc daemonProc
	var base string
	if b.Jail != nil {
		proc, base, err = b.startJailed(spec, dir, secret, logW)
	} else {
		proc, base, err = b.startShared(ctx, spec, dir, secret, logW)
	}
	if err != nil {
		logW.Close()
		return provision.Daemon{}, fmt.Errorf("start daemon: %w", err)
	}
	nd := &daemon{id: spec.ID, runs: runs, url: base, secret: secret, proc: proc}
	b.watch(nd, logW)
	return b.running(nd, false), nil
}

func (b *Backend) running(d *daemon, adopted bool) provision.Daemon {
	return provision.Daemon{URL: d.url, Secret: d.secret, Log: []any{"pid", d.proc.Pid(), "jailed", b.Jail != nil, "adopted", adopted}}
}

// watch registers d and follows it until it ends: a daemon that ends on
// its own is reported to the reconciler, which restarts it.
func (b *Backend) watch(d *daemon, logs *os.File) {
	d.ended, d.since = make(chan struct{}), time.Now()
	b.mu.Lock()
	b.daemons[d.id] = d
	b.mu.Unlock()
	go func() {
		err := d.proc.Wait()
		logs.Close()
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

// stop ends d: SIGTERM lets the daemon cancel its runs and stop its agent
// (a jail's init passes it on); after 5 s it is killed.
func (b *Backend) stop(d *daemon) {
	b.mu.Lock()
	d.stopping = true
	b.mu.Unlock()
	d.proc.Signal(syscall.SIGTERM)
	select {
	case <-d.ended:
	case <-time.After(5 * time.Second):
		d.proc.Kill()
		<-d.ended
	}
}

// Sleep ends the intern's daemon (or the jail a previous gateway left).
func (b *Backend) Sleep(ctx context.Context, id string) error {
	b.mu.Lock()
	d := b.daemons[id]
	if d != nil && d.proc == nil {
		delete(b.daemons, id)
	}
	b.mu.Unlock()
	switch {
	case d == nil:
	case d.proc == nil:
		b.stopJails([]string{id}, "its intern no longer runs")
	default:
		b.stop(d)
	}
	return nil
}

// Remove ends the intern's daemon and removes its directory.
func (b *Backend) Remove(ctx context.Context, id string) error {
	b.Sleep(ctx, id)
	// What its jail made belongs to the jail's user.
	return jail.RemoveAll(b.internDir(id))
}

// Close stops every daemon, all at once (their runs end with them), or,
// when jails outlive their gateway (JailConfig.Orphan), lets go of them
// for the next gateway to adopt.
func (b *Backend) Close() {
	b.mu.Lock()
	b.closed = true
	leaving := b.Jail != nil && b.Jail.Orphan > 0
	var ds []*daemon
	for _, d := range b.daemons {
		ds = append(ds, d)
	}
	b.daemons = map[string]*daemon{}
	log := b.log
	b.mu.Unlock()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
		b.log = log
	}
	if leaving {
		if len(ds) > 0 {
			log.Info("interns' jails left running for the next gateway", "interns", len(ds), "stop_without_one_after", b.Jail.Orphan.String())
		}
		for _, d := range ds {
			if d.proc != nil && !d.proc.Detach() {
				b.stop(d)
			}
		}
		return
	}
	var wg sync.WaitGroup
	for _, d := range ds {
		if d.proc == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.stop(d)
		}()
	}
	wg.Wait()
	if b.Jail != nil {
		// Jails a previous gateway left that this one had not attached
		// yet (a stop right after a start) would otherwise run on for the
		// previous gateway's orphan timeout.
		b.stopJails(b.aliveJails(), "the gateway stops, and its jails with it")
	}
}

// internDir is absolute: a jail binds it, and a daemon's working
// directory is not the gateway's.
func (b *Backend) internDir(id string) string {
	dir := filepath.Join(b.DataDir, "interns", id)
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// DaemonPID returns the pid of the intern's daemon (a jail's init), or 0
// (for operators' diagnostics and tests).
func (b *Backend) DaemonPID(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := b.daemons[id]; d != nil && d.proc != nil {
		return d.proc.Pid()
	}
	return 0
}

// daemonEnviron is what of the gateway's environment an unjailed daemon
// gets: what its agent may have (agents.Environ's allowlist, which keeps
// the gateway's COHORT_* settings and any cloud key or token out), and the
// OTEL_*_HEADERS its own trace exporter may need, which its agent does not
// get. A daemon is configured by its flags.
func daemonEnviron(env []string) []string {
	out := agents.Environ(env)
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "OTEL_") && !agents.Passes(name) {
			out = append(out, kv)
		}
	}
	return out
}

// forwardLogs copies a daemon's log lines into the gateway's log.
func forwardLogs(log *slog.Logger, id string, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 256<<10)
	for sc.Scan() {
		// A JSON line is nested as JSON, not as an escaped string, so the
		// gateway's log stays one parseable object per line.
		if b := sc.Bytes(); json.Valid(b) {
			log.Info("intern daemon", "intern", id, "log", json.RawMessage(append([]byte(nil), b...)))
			continue
		}
		log.Info("intern daemon", "intern", id, "line", sc.Text())
	}
}

// daemonProc is a started daemon: a plain child, or a jail's init.
type daemonProc interface {
	Pid() int
	Signal(syscall.Signal) error
	// Kill ends the daemon and everything it started.
	Kill()
	Wait() error
	// Detach lets go of a daemon that may outlive the gateway (a jail
	// with a control socket), reporting whether it did.
	Detach() bool
}

// sharedProc is a daemon run on the gateway's own host (--unsafe-shared-host).
type sharedProc struct{ cmd *exec.Cmd }

func (c sharedProc) Pid() int                        { return c.cmd.Process.Pid }
func (c sharedProc) Signal(sig syscall.Signal) error { return c.cmd.Process.Signal(sig) }
func (c sharedProc) Kill()                           { syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL) }
func (c sharedProc) Wait() error                     { return c.cmd.Wait() }
func (c sharedProc) Detach() bool                    { return false }

// jailProc is a jail's init, started or adopted, reached through its
// control socket: killing it ends its whole PID namespace.
type jailProc struct{ j *jail.Jail }

func (c jailProc) Pid() int                        { return c.j.Pid() }
func (c jailProc) Signal(sig syscall.Signal) error { return c.j.Signal(sig) }
func (c jailProc) Kill()                           { c.j.Kill() }
func (c jailProc) Detach() bool {
	c.j.Detach()
	return true
}

// Wait waits until the jail ends (or this gateway lets go of it).
func (c jailProc) Wait() error {
	<-c.j.Done()
	code, ok := c.j.Exit()
	switch {
	case !ok:
		return errors.New("the jail ended without a status (killed, or let go)")
	case code != 0:
		return fmt.Errorf("jail exited with status %d", code)
	}
	return nil
}

// startShared starts the daemon as a plain child on the gateway's host and
// reads the address it reports on stdout.
func (b *Backend) startShared(ctx context.Context, spec provision.Spec, dir, secret string, logs *os.File) (daemonProc, string, error) {
	argv, err := b.selfCommand()
	if err != nil {
		return nil, "", err
	}
	run, err := b.Agents.For(spec.Agent, false)
	if err != nil {
		return nil, "", err
	}
	d := b.daemon(spec.ID, spec.Model, run)
	d.Listen, d.DataDir, d.GatewayURL = "127.0.0.1:0", dir, b.GatewayURL
	args := append(append(slices.Clone(argv[1:]), "intern"), d.Args()...)
	cmd := exec.Command(argv[0], args...)
	// The secret goes by environment, never on the command line (ps shows that).
	cmd.Env = append(daemonEnviron(os.Environ()), "COHORT_INTERN_SECRET="+secret)
	cmd.SysProcAttr = sysProcAttr()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, "", err
	}
	cmd.Stdout, cmd.Stderr = outW, logs
	// From spawn's thread: the Pdeathsig would fire when the forking thread ends, which
	// Go does to a thread now and then, SIGTERMing a daemon in the middle of its work (#42).
	err = spawn.Start(cmd)
	outW.Close()
	if err != nil {
		outR.Close()
		return nil, "", err
	}
	proc := sharedProc{cmd}
	addrc := make(chan string, 1)
	go func() {
		br := bufio.NewReader(outR)
		line, _ := br.ReadString('\n')
		addrc <- strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "listening on "))
		io.Copy(io.Discard, br)
		outR.Close()
	}()
	fail := func(err error) (daemonProc, string, error) {
		proc.Kill()
		proc.Wait()
		return nil, "", err
	}
	var base string
	select {
	case base = <-addrc:
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-time.After(b.startTimeout()):
		return fail(errors.New("the daemon did not report its address in time"))
	}
	if !strings.HasPrefix(base, "http://") {
		return fail(fmt.Errorf("the daemon reported no address (%q)", base))
	}
	return proc, base, nil
}

// daemon is the launch every local daemon gets, jailed or not, with its
// agent's part; the caller adds where it listens.
func (b *Backend) daemon(id, model string, run provision.AgentRun) launch.Daemon {
	d := launch.Daemon{InternID: id, Model: model, InteractionDeadline: max(b.InteractionDeadline, 0), Agent: run.Launch}
	if b.Jail == nil {
		d.HTTPToolCAFile = b.HTTPToolCAFile
	}
	return d
}
