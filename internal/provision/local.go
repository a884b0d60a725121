package provision

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/store"
)

// supervisor keeps one local daemon running for one intern.
type supervisor struct {
	p     *Provisioner
	id    string
	model string
	agent string
	// limits are the intern's own (its row's), applied to its jail.
	limits store.InternLimits
	cancel context.CancelFunc
	done   chan struct{}
	// up is closed once a daemon has answered Status and the intern is
	// running; failed, if the first attempt failed before that (err says
	// why). A wake waits on either.
	up, failed chan struct{}
	err        error

	// Guarded by p.mu.
	cur      int // the current daemon's pid
	dialer   func() interndv1connect.InternDaemonServiceClient
	lastUsed time.Time // the last call to the daemon, or its start
	open     int       // streams from the daemon being read
}

// isUp reports whether the daemon has come up (under p.mu or not).
func (s *supervisor) isUp() bool {
	select {
	case <-s.up:
		return true
	default:
		return false
	}
}

// client dials the current daemon (after up).
func (s *supervisor) client() interndv1connect.InternDaemonServiceClient {
	s.p.mu.Lock()
	d := s.dialer
	s.p.mu.Unlock()
	return d()
}

func (s *supervisor) stop() {
	s.cancel()
	<-s.done
}

// localChanged starts, restarts or stops the intern's daemon.
func (p *Provisioner) localChanged(in *store.Intern) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	s := p.sups[in.ID]
	switch in.State {
	case store.InternProvisioning, store.InternRunning:
		if s != nil && s.model == in.Model && s.agent == in.Agent && s.limits == in.Limits {
			if in.State == store.InternProvisioning && s.isUp() {
				// Suspended and resumed between two looks at the database:
				// the daemon never stopped, and its row says running again.
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if err := p.setRunning(ctx, in.ID); err != nil {
						p.Log.Error("mark intern running", "intern", in.ID, "err", err)
					}
				}()
			}
			return
		}
		prev := s
		if prev != nil {
			// The model, the agent or the limits changed: the jail restarts
			// with the new ones.
			go prev.stop()
		}
		ctx, cancel := context.WithCancel(context.Background())
		s = &supervisor{p: p, id: in.ID, model: in.Model, agent: in.Agent, limits: in.Limits, cancel: cancel, done: make(chan struct{}),
			up: make(chan struct{}), failed: make(chan struct{}), lastUsed: time.Now()}
		p.sups[in.ID] = s
		go func() {
			if prev != nil {
				<-prev.done // one daemon at a time on a data directory
			}
			s.run(ctx)
		}()
	default:
		if s != nil {
			delete(p.sups, in.ID)
			go func() {
				s.stop()
				if in.State == store.InternDeleted {
					// What its jail made belongs to the jail's user.
					jail.RemoveAll(p.internDir(in.ID))
				}
			}()
		}
	}
}

// internDir is absolute: a jail binds it, and a daemon's working
// directory is not the gateway's.
func (p *Provisioner) internDir(id string) string {
	dir := filepath.Join(p.DataDir, "interns", id)
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// DaemonPID returns the pid of the intern's local daemon, or 0 (for
// operators' diagnostics and tests).
func (p *Provisioner) DaemonPID(id string) int {
	p.init()
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.sups[id]; s != nil {
		return s.cur
	}
	return 0
}

func (s *supervisor) setPID(pid int) {
	s.p.mu.Lock()
	s.cur = pid
	s.p.mu.Unlock()
}

// run starts the daemon and restarts it whenever it dies, with a doubling
// backoff, until stopped.
func (s *supervisor) run(ctx context.Context) {
	defer close(s.done)
	backoff := s.p.RestartBackoff
	for {
		started := time.Now()
		err := s.once(ctx)
		if ctx.Err() != nil {
			s.p.Log.Info("intern daemon stopped", "intern", s.id)
			return
		}
		if !s.isUp() {
			select {
			case <-s.failed:
			default:
				s.err = err
				close(s.failed)
			}
		}
		s.p.Log.Error("intern daemon stopped; restarting", "intern", s.id, "err", err, "in", backoff)
		if time.Since(started) > time.Minute {
			backoff = s.p.RestartBackoff
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// started is a daemon a supervisor runs: started now, or adopted from a
// previous gateway (its row already holds its URL and secret).
type started struct {
	proc    daemonProc
	base    string
	secret  string
	adopted bool
}

// once runs one daemon process until it exits or ctx ends.
func (s *supervisor) once(ctx context.Context) error {
	p := s.p
	dir := p.internDir(s.id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// At most StartConcurrency daemons start at once; the slot is held
	// until this one answers (or fails).
	select {
	case p.fleet.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	starting := true
	release := func() {
		if starting {
			starting = false
			<-p.fleet.sem
		}
	}
	defer release()
	// The daemon's log lines (and a jail's own errors) join the gateway's.
	logR, logW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer logW.Close()
	go forwardLogs(p, s.id, logR)
	var d started
	if p.Jail != nil {
		if d, err = s.adopt(ctx, dir, logW); err == nil && d.proc == nil {
			d, err = s.startJailed(dir, logW)
		}
	} else {
		d, err = s.startShared(ctx, dir, logW)
	}
	if err != nil {
		return fmt.Errorf("start daemon: %w", err)
	}
	s.setPID(d.proc.Pid())
	defer s.setPID(0)
	exited := make(chan error, 1)
	go func() { exited <- d.proc.Wait() }()
	kill := func() error {
		// SIGTERM lets the daemon cancel its runs and stop its agent (a
		// jail's init passes it on).
		d.proc.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(5 * time.Second):
			d.proc.Kill()
			return <-exited
		}
	}

	if !d.adopted {
		if err := p.waitHealthy(ctx, d.base, d.secret); err != nil {
			kill()
			return err
		}
		wrapped, err := p.wrap(s.id, d.secret)
		if err != nil {
			kill()
			return err
		}
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = p.DB.NewUpdate().Model((*store.Intern)(nil)).
			Set("daemon_url = ?", d.base).Set("daemon_secret = ?", wrapped).Set("provisioner = ?", Local).
			Where("id = ?", s.id).Exec(uctx)
		cancel()
		if err != nil {
			kill()
			return err
		}
	}
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = p.setRunning(uctx, s.id)
	cancel()
	if err != nil {
		kill()
		return err
	}
	release()
	p.mu.Lock()
	// The fleet's own calls (is it idle?) are not the intern's activity.
	s.dialer = func() interndv1connect.InternDaemonServiceClient { return p.dial("", d.base, d.secret) }
	s.lastUsed = time.Now()
	p.mu.Unlock()
	if !s.isUp() {
		close(s.up)
	}
	p.Log.Info("intern daemon running", "intern", s.id, "url", d.base, "pid", d.proc.Pid(), "jailed", p.Jail != nil, "adopted", d.adopted)

	select {
	case err := <-exited:
		if err == nil {
			err = errors.New("exited")
		}
		return err
	case <-ctx.Done():
		if p.isLeaving() && d.proc.Detach() {
			// The gateway is going; the next one adopts this jail.
			return ctx.Err()
		}
		kill()
		return ctx.Err()
	}
}

// isLeaving reports whether the gateway is closing with its jails left
// running for the next one.
func (p *Provisioner) isLeaving() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leaving
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

// waitHealthy polls the daemon's Status with its secret.
func (p *Provisioner) waitHealthy(ctx context.Context, base, secret string) error {
	ctx, cancel := context.WithTimeout(ctx, p.HealthTimeout)
	defer cancel()
	c := p.dial("", base, secret)
	for {
		_, err := c.Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the daemon did not become healthy: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// forwardLogs copies a daemon's log lines into the gateway's log.
func forwardLogs(p *Provisioner, id string, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 256<<10)
	for sc.Scan() {
		// A JSON line is nested as JSON, not as an escaped string, so the
		// gateway's log stays one parseable object per line.
		if b := sc.Bytes(); json.Valid(b) {
			p.Log.Info("intern daemon", "intern", id, "log", json.RawMessage(append([]byte(nil), b...)))
			continue
		}
		p.Log.Info("intern daemon", "intern", id, "line", sc.Text())
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
func (s *supervisor) startShared(ctx context.Context, dir string, logs *os.File) (started, error) {
	p := s.p
	argv, err := p.selfCommand()
	if err != nil {
		return started{}, err
	}
	args := append(append([]string{}, argv[1:]...), "intern", "--listen", "127.0.0.1:0", "--data-dir", dir,
		"--intern-id", s.id, "--model", s.model)
	run, err := p.agentFor(s.agent, false)
	if err != nil {
		return started{}, err
	}
	args = append(args, p.daemonFlags()...)
	args = append(args, run.flags...)
	if p.GatewayURL != "" {
		args = append(args, "--gateway-url", p.GatewayURL)
	}
	secret := newSecret()
	cmd := exec.Command(argv[0], args...)
	// The secret goes by environment, never on the command line (ps shows that).
	cmd.Env = append(daemonEnviron(os.Environ()), "COHORT_INTERN_SECRET="+secret)
	cmd.SysProcAttr = sysProcAttr()
	outR, outW, err := os.Pipe()
	if err != nil {
		return started{}, err
	}
	cmd.Stdout, cmd.Stderr = outW, logs
	err = cmd.Start()
	outW.Close()
	if err != nil {
		outR.Close()
		return started{}, err
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
	fail := func(err error) (started, error) {
		proc.Kill()
		proc.Wait()
		return started{}, err
	}
	var base string
	select {
	case base = <-addrc:
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-time.After(p.HealthTimeout):
		return fail(errors.New("the daemon did not report its address in time"))
	}
	if !strings.HasPrefix(base, "http://") {
		return fail(fmt.Errorf("the daemon reported no address (%q)", base))
	}
	return started{proc: proc, base: base, secret: secret}, nil
}

// daemonFlags are the `cohort intern` flags every local daemon gets, jailed
// or not, besides its agent's (agentFor).
func (p *Provisioner) daemonFlags() []string {
	var args []string
	if p.InteractionDeadline > 0 {
		args = append(args, "--interaction-deadline", p.InteractionDeadline.String())
	}
	if p.HTTPToolCAFile != "" && p.Jail == nil {
		args = append(args, "--http-tool-ca-file", p.HTTPToolCAFile)
	}
	return args
}
