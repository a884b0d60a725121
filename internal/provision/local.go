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
	"github.com/cohort-dev/cohort/internal/store"
)

// supervisor keeps one local daemon running for one intern.
type supervisor struct {
	p      *Provisioner
	id     string
	model  string
	cancel context.CancelFunc
	done   chan struct{}
	cur    int // the current daemon's pid (guarded by p.mu)
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
		if s != nil && s.model == in.Model {
			return
		}
		prev := s
		if prev != nil {
			// The model changed: the daemon restarts with the new one.
			go prev.stop()
		}
		ctx, cancel := context.WithCancel(context.Background())
		s = &supervisor{p: p, id: in.ID, model: in.Model, cancel: cancel, done: make(chan struct{})}
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
					os.RemoveAll(p.internDir(in.ID))
				}
			}()
		}
	}
}

func (p *Provisioner) internDir(id string) string {
	return filepath.Join(p.DataDir, "interns", id)
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
			return
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

// once runs one daemon process until it exits or ctx ends.
func (s *supervisor) once(ctx context.Context) error {
	p := s.p
	dir := p.internDir(s.id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	secret := newSecret()
	argv := p.Command
	if len(argv) == 0 {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		argv = []string{self}
	}
	args := append(append([]string{}, argv[1:]...), "intern", "--listen", "127.0.0.1:0", "--data-dir", dir,
		"--intern-id", s.id, "--model", s.model)
	if p.AgentCommand != "" {
		args = append(args, "--agent-command", p.AgentCommand)
	}
	if p.GatewayURL != "" {
		args = append(args, "--gateway-url", p.GatewayURL)
	}
	cmd := exec.Command(argv[0], args...)
	// The secret goes by environment, never on the command line (ps shows that).
	cmd.Env = append(daemonEnviron(os.Environ()), "COHORT_INTERN_SECRET="+secret)
	cmd.SysProcAttr = sysProcAttr()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start daemon: %w", err)
	}
	s.setPID(cmd.Process.Pid)
	defer s.setPID(0)
	go forwardLogs(p, s.id, stderr)
	exited := make(chan error, 1)
	addrc := make(chan string, 1)
	go func() {
		br := bufio.NewReader(stdout)
		line, _ := br.ReadString('\n')
		addrc <- strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "listening on "))
		io.Copy(io.Discard, br)
		exited <- cmd.Wait()
	}()
	kill := func() error {
		// SIGTERM lets the daemon cancel its runs and stop its agent.
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			return <-exited
		}
	}

	var base string
	select {
	case base = <-addrc:
	case <-ctx.Done():
		kill()
		return ctx.Err()
	case <-time.After(p.HealthTimeout):
		kill()
		return errors.New("the daemon did not report its address in time")
	}
	if !strings.HasPrefix(base, "http://") {
		kill()
		return fmt.Errorf("the daemon reported no address (%q)", base)
	}
	if err := p.waitHealthy(ctx, base, secret); err != nil {
		kill()
		return err
	}
	wrapped, err := p.wrap(s.id, secret)
	if err != nil {
		kill()
		return err
	}
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("daemon_url = ?", base).Set("daemon_secret = ?", wrapped).Set("provisioner = ?", Local).
		Where("id = ?", s.id).Exec(uctx)
	if err == nil {
		err = p.setRunning(uctx, s.id)
	}
	cancel()
	if err != nil {
		kill()
		return err
	}
	p.Log.Info("intern daemon running", "intern", s.id, "url", base, "pid", cmd.Process.Pid)

	select {
	case err := <-exited:
		if err == nil {
			err = errors.New("exited")
		}
		return err
	case <-ctx.Done():
		kill()
		return ctx.Err()
	}
}

// daemonEnviron is the gateway's environment minus its COHORT_* settings
// (database URL, key file…): a daemon is configured by its flags, and the
// gateway's settings must not reach the agent. The built-in agent's
// settings (COHORT_AGENT_*) pass.
func daemonEnviron(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if strings.HasPrefix(kv, "COHORT_") && !strings.HasPrefix(kv, "COHORT_AGENT_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// waitHealthy polls the daemon's Status with its secret.
func (p *Provisioner) waitHealthy(ctx context.Context, base, secret string) error {
	ctx, cancel := context.WithTimeout(ctx, p.HealthTimeout)
	defer cancel()
	c := p.dial(base, secret)
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
