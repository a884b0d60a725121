package internd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	acp "github.com/coder/acp-go-sdk"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/internd/acptap"
	"github.com/cohort-dev/cohort/internal/jail"
)

// agentGen numbers agent processes, so a session knows whether the agent
// that holds its ACP session is still the one running.
var agentGen atomic.Uint64

// agentProc is one agent subprocess and our ACP connection to it.
type agentProc struct {
	gen   uint64
	cmd   *exec.Cmd
	conn  *acp.ClientSideConnection
	caps  acp.AgentCapabilities
	done  chan struct{} // closed when the process has exited
	once  sync.Once
	stdin io.Closer
	// tap reads the agent's stdout before the SDK does: session/update
	// text is decoded there, in order (acptap).
	tap *acptap.Tap
}

// settle waits until every line the agent wrote so far has been handled
// (acptap.Tap.Settle). The daemon's own MCP tool calls it before pausing
// the run, so that text the agent streamed just before calling the tool is
// in the run's events before the interaction.
func (a *agentProc) settle() {
	if a == nil {
		return
	}
	a.tap.Settle()
}

// stop ends the agent: its input closes, it has a moment to exit, then its
// process group is killed.
func (a *agentProc) stop() {
	a.once.Do(func() {
		if a.cmd.Process == nil {
			return
		}
		// The end of its input is an ACP agent's cue to exit; what it
		// started goes with its process group either way.
		if a.stdin != nil {
			a.stdin.Close()
		}
		select {
		case <-a.done:
		case <-time.After(200 * time.Millisecond):
		}
		syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		a.cmd.Process.Kill()
		<-a.done
	})
}

// usable reports whether a can take a turn. An agent whose connection
// ended (it crashed, or was killed by a command it ran) is dead or dying
// even if its exit has not been seen yet: it is stopped and forgotten, so
// the turn starts another instead of writing into a broken pipe.
func (d *Daemon) usable(a *agentProc) bool {
	select {
	case <-a.conn.Done():
	default:
		return true
	}
	a.stop()
	select {
	case <-a.done:
	case <-time.After(5 * time.Second):
	}
	d.agentExited(a, errors.New("the agent closed its connection"))
	return false
}

// ensureAgent returns the running agent, starting one if none is up.
func (d *Daemon) ensureAgent(ctx context.Context) (*agentProc, error) {
	d.mu.Lock()
	a := d.agent
	d.mu.Unlock()
	if a != nil && d.usable(a) {
		return a, nil
	}
	d.agentMu.Lock()
	defer d.agentMu.Unlock()
	d.mu.Lock()
	a = d.agent
	d.mu.Unlock()
	if a != nil && d.usable(a) {
		return a, nil
	}
	a, info, err := d.startAgent(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.agentErr = err.Error()
		d.log.Error("agent not available", "err", err)
		return nil, errTurnFailed("the intern's agent is not available: %v", err)
	}
	d.agent, d.agentErr, d.agentID = a, "", info
	d.log.Info("agent started", "agent", info, "pid", a.cmd.Process.Pid, "load_session", a.caps.LoadSession)
	return a, nil
}

func (d *Daemon) startAgent(ctx context.Context) (*agentProc, string, error) {
	cmd := exec.Command(d.cfg.AgentCommand[0], d.cfg.AgentCommand[1:]...)
	cmd.Dir = d.work
	// From an allowlist, as every daemon does (agents.Environ): the host's
	// or the operator's other variables (cloud keys, tokens, Cohort's own
	// settings) are no business of the agent or of what it runs.
	cmd.Env = append(agents.Environ(os.Environ()), d.cfg.AgentEnv...)
	// The built-in agent's settings (its flags' COHORT_AGENT_* twins): the
	// intern's model, and a state directory so that session/load works
	// across restarts. Other agents ignore them.
	cmd.Env = append(cmd.Env, "COHORT_AGENT_STATE_DIR="+filepath.Join(d.cfg.DataDir, "agent-state"))
	if d.cfg.Model != "" {
		cmd.Env = append(cmd.Env, "COHORT_AGENT_MODEL="+d.cfg.Model)
	}
	// Its own process group, so stopping it stops what it spawned.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	level := jail.SeccompStrict
	if d.cfg.AgentNests {
		level = jail.SeccompOff // it has the daemon's own, and filters its commands
	}
	if err := jail.StartFiltered(cmd, level); err != nil {
		return nil, "", fmt.Errorf("start agent: %w", err)
	}
	a := &agentProc{gen: agentGen.Add(1), cmd: cmd, done: make(chan struct{}), stdin: stdin}
	go d.agentStderr(stderr)
	c := &client{d: d, a: a}
	tap, sdkIn := acptap.Start(stdout, func(u acptap.Update) { d.update(u.SessionID, u.Text, u.Model, u.Thought) })
	a.tap = tap
	a.conn = acp.NewClientSideConnection(c, stdin, sdkIn)
	a.conn.SetLogger(d.log.With("component", "acp"))
	go func() {
		err := cmd.Wait()
		close(a.done)
		d.agentExited(a, err)
	}()

	ictx, cancel := context.WithTimeout(ctx, d.cfg.InitTimeout)
	defer cancel()
	res, err := a.conn.Initialize(ictx, acp.InitializeRequest{
		ProtocolVersion: acp.ProtocolVersionNumber,
		ClientInfo:      &acp.Implementation{Name: "cohort-intern", Version: "1"},
		ClientCapabilities: acp.ClientCapabilities{
			Elicitation: &acp.ElicitationCapabilities{Form: &acp.ElicitationFormCapabilities{}},
		},
	})
	if err != nil {
		a.stop()
		if errors.Is(ictx.Err(), context.DeadlineExceeded) {
			return nil, "", fmt.Errorf("the agent did not answer initialize within %s", d.cfg.InitTimeout)
		}
		if msg := d.agentMessage(err); msg != "" {
			return nil, "", fmt.Errorf("the agent refused initialize: %s", msg)
		}
		return nil, "", fmt.Errorf("initialize: %w", err)
	}
	if m := d.cfg.AgentAuthMethod; m != "" && advertises(res.AuthMethods, m) {
		actx, cancel := context.WithTimeout(ctx, d.cfg.InitTimeout)
		_, err := a.conn.Authenticate(actx, acp.AuthenticateRequest{MethodId: m})
		cancel()
		if err != nil {
			a.stop()
			if msg := d.agentMessage(err); msg != "" {
				return nil, "", fmt.Errorf("the agent refused authenticate with method %q: %s", m, msg)
			}
			return nil, "", fmt.Errorf("authenticate with method %q: %w", m, err)
		}
	}
	a.caps = res.AgentCapabilities
	info := "unknown agent"
	if res.AgentInfo != nil {
		info = res.AgentInfo.Name
		if res.AgentInfo.Version != "" {
			info += " " + res.AgentInfo.Version
		}
	}
	return a, info, nil
}

// agentStderr logs what the agent writes on stderr, line by line.
func (d *Daemon) agentStderr(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		if b := sc.Bytes(); json.Valid(b) {
			d.log.Info("agent", "log", json.RawMessage(append([]byte(nil), b...)))
			continue
		}
		d.log.Info("agent", "stderr", sc.Text())
	}
}

// agentExited forgets a dead agent; the next turn starts another.
func (d *Daemon) agentExited(a *agentProc, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.agent != a {
		return
	}
	d.agent = nil
	msg := "the agent exited"
	if err != nil {
		msg += ": " + err.Error()
	}
	if !d.closed {
		d.agentErr = msg
		d.log.Error("agent exited", "err", err)
	}
}

// ensureSession makes sure the agent holds an ACP session for s and returns
// its id: the one it already has, one loaded (session/load, or resumed)
// after an agent restart when the agent supports it, or a new one under
// our same session id otherwise.
func (d *Daemon) ensureSession(ctx context.Context, a *agentProc, s *session) (string, error) {
	d.mu.Lock()
	acpID, gen := s.rec.ACPSessionID, s.acpGen
	d.mu.Unlock()
	if acpID != "" && gen == a.gen {
		return acpID, nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.InitTimeout)
	defer cancel()
	var model *acp.SessionModelState
	newID := ""
	// The intern's configured model, by the built-in agent's convention.
	var meta map[string]any
	if d.cfg.Model != "" {
		meta = map[string]any{MetaModel: d.cfg.Model}
	}
	// The daemon's MCP server (http_request) for agents that take MCP
	// over HTTP; a fresh credential per ACP session.
	servers := []acp.McpServer{}
	if a.caps.McpCapabilities.Http {
		servers = append(servers, d.tools.bind(s))
	}
	if acpID != "" {
		// Map the id first: a load replays history as session/update,
		// which must find the session (and is dropped, no run being live).
		d.mu.Lock()
		d.byACP[acpID] = s
		d.mu.Unlock()
		switch {
		case a.caps.LoadSession:
			res, err := a.conn.LoadSession(ctx, acp.LoadSessionRequest{Meta: meta, SessionId: acp.SessionId(acpID), Cwd: d.work, McpServers: servers})
			if err == nil {
				newID, model = acpID, res.Models
			} else {
				d.log.Warn("session/load failed; starting a new agent session", "err", err)
			}
		case a.caps.SessionCapabilities.Resume != nil:
			res, err := a.conn.ResumeSession(ctx, acp.ResumeSessionRequest{Meta: meta, SessionId: acp.SessionId(acpID), Cwd: d.work})
			if err == nil {
				newID, model = acpID, res.Models
			} else {
				d.log.Warn("session/resume failed; starting a new agent session", "err", err)
			}
		}
	}
	if newID == "" {
		res, err := a.conn.NewSession(ctx, acp.NewSessionRequest{Meta: meta, Cwd: d.work, McpServers: servers})
		if err != nil {
			d.log.Warn("session/new failed", "err", err)
			if msg := d.agentMessage(err); msg != "" {
				return "", errTurnFailed("the agent refused a new session: %s", msg)
			}
			return "", errTurnFailed("the agent refused a new session")
		}
		newID, model = string(res.SessionId), res.Models
	}
	d.mu.Lock()
	if acpID != "" && acpID != newID {
		delete(d.byACP, acpID)
	}
	s.rec.ACPSessionID, s.acpGen = newID, a.gen
	if model != nil {
		s.model = string(model.CurrentModelId)
	}
	d.byACP[newID] = s
	head := *s.rec
	unsaved := s.unsaved
	s.unsaved = false
	d.mu.Unlock()
	var err error
	if unsaved {
		err = d.store.create(&head)
	} else {
		err = d.store.update(head.ID, func(rec *sessionRecord) {
			rec.ACPSessionID, rec.UpdatedAt = head.ACPSessionID, head.UpdatedAt
			if rec.CreatedAt.IsZero() {
				rec.CreatedAt = head.CreatedAt
			}
		})
	}
	if err != nil {
		return "", apierr.Internal(err)
	}
	return newID, nil
}

// runFor returns the live run of the ACP session id, if any.
func (d *Daemon) runFor(acpID string) *run {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.byACP[acpID]
	if s == nil || !s.busy {
		return nil
	}
	return s.current
}

// client is the daemon's side of ACP: what the agent may ask of us.
type client struct {
	d *Daemon
	a *agentProc
}

var (
	_ acp.Client = (*client)(nil)
	_ interface {
		UnstableCreateElicitation(context.Context, acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error)
	} = (*client)(nil)
)

func metaString(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}

// SessionUpdate handles updates the tap (acptap) did not (it handles all
// it can decode): message and thought chunks become events of the session's run.
func (c *client) SessionUpdate(ctx context.Context, n acp.SessionNotification) error {
	var text string
	var meta map[string]any
	thought := false
	switch u := n.Update; {
	case u.AgentMessageChunk != nil && u.AgentMessageChunk.Content.Text != nil:
		text, meta = u.AgentMessageChunk.Content.Text.Text, u.AgentMessageChunk.Meta
	case u.AgentThoughtChunk != nil && u.AgentThoughtChunk.Content.Text != nil:
		text, meta, thought = u.AgentThoughtChunk.Content.Text.Text, u.AgentThoughtChunk.Meta, true
	default:
		return nil
	}
	model := metaString(n.Meta, MetaModel)
	if model == "" {
		model = metaString(meta, MetaModel)
	}
	c.d.update(string(n.SessionId), text, model, thought)
	return nil
}

// update turns a message or thought chunk into an event of the session's
// live run; outside a run (a session/load replay, say) it is dropped.
func (d *Daemon) update(acpID, text, model string, thought bool) {
	r := d.runFor(acpID)
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waitConsumerLocked()
	if r.state != stateStreaming || r.cancelling {
		return
	}
	if model != "" {
		r.model = model
	} else {
		model = r.modelLocked()
	}
	if !thought && r.reply.Len() < maxHistoryText {
		r.reply.WriteString(text)
	}
	if r.log.merge(text, model, thought) {
		return
	}
	ev := &pb.RunEvent{Model: model}
	if thought {
		ev.Event = &pb.RunEvent_Reasoning{Reasoning: &pb.ReasoningDelta{Text: text}}
	} else {
		ev.Event = &pb.RunEvent_Text{Text: &pb.TextDelta{Text: text}}
	}
	r.addLocked(ev)
}

// RequestPermission answers for the caller in self-drive mode and asks the
// caller (a Permission interaction) in manual mode.
func (c *client) RequestPermission(ctx context.Context, p acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	cancelled := acp.RequestPermissionResponse{Outcome: acp.RequestPermissionOutcome{Cancelled: &acp.RequestPermissionOutcomeCancelled{Outcome: "cancelled"}}}
	selected := func(id acp.PermissionOptionId) acp.RequestPermissionResponse {
		return acp.RequestPermissionResponse{Outcome: acp.RequestPermissionOutcome{Selected: &acp.RequestPermissionOutcomeSelected{OptionId: id, Outcome: "selected"}}}
	}
	r := c.d.runFor(string(p.SessionId))
	if r == nil {
		return cancelled, nil
	}
	ia := &interaction{optionID: map[string]acp.PermissionOptionId{}}
	for _, o := range p.Options {
		k := string(o.Kind)
		if _, dup := ia.optionID[k]; dup || !isPermissionKind(k) {
			continue
		}
		ia.optionID[k] = o.OptionId
		ia.kinds = append(ia.kinds, k)
	}
	if r.mode == pb.ApprovalMode_APPROVAL_MODE_SELF_DRIVE {
		// Consent on the caller's behalf, once if the agent offers that.
		for _, k := range []string{"allow_once", "allow_always"} {
			if id, ok := ia.optionID[k]; ok {
				return selected(id), nil
			}
		}
		return cancelled, nil
	}
	ev := &pb.Interaction{Kind: &pb.Interaction_Permission{Permission: &pb.Permission{Options: ia.kinds}}}
	if t := p.ToolCall.Title; t != nil && *t != "" {
		ev.GetPermission().Operation = t
	} else if p.ToolCall.Kind != nil {
		op := string(*p.ToolCall.Kind)
		ev.GetPermission().Operation = &op
	}
	// What is asked, besides the spec's fields, so the caller does not approve blind.
	if t := p.ToolCall.Title; t != nil {
		ev.GetPermission().Title = truncateInput(*t, 512)
	}
	ev.GetPermission().Input = permissionInput(p.ToolCall)
	rep := r.ask(ctx, ia, ev)
	if rep.cancel || rep.optionID == "" {
		return cancelled, nil
	}
	return selected(rep.optionID), nil
}

func isPermissionKind(k string) bool {
	for _, p := range permissionKinds {
		if p == k {
			return true
		}
	}
	return false
}

// UnstableCreateElicitation always becomes a Question interaction.
func (c *client) UnstableCreateElicitation(ctx context.Context, p acp.UnstableCreateElicitationRequest) (acp.UnstableCreateElicitationResponse, error) {
	cancel := acp.UnstableCreateElicitationResponse{Cancel: &acp.UnstableCreateElicitationCancel{Action: "cancel"}}
	if p.Form == nil {
		// URL elicitations cannot be carried to an API caller.
		return cancel, nil
	}
	r := c.d.elicitationRun(p.Form.Meta)
	if r == nil {
		return cancel, nil
	}
	ia := &interaction{question: true, fields: fieldsFromSchema(p.Form.RequestedSchema)}
	ev := &pb.Interaction{Kind: &pb.Interaction_Question{Question: &pb.Question{Message: p.Form.Message, Fields: ia.fields}}}
	rep := r.ask(ctx, ia, ev)
	switch {
	case rep.cancel:
		return cancel, nil
	case rep.decline:
		return acp.UnstableCreateElicitationResponse{Decline: &acp.UnstableCreateElicitationDecline{Action: "decline"}}, nil
	default:
		return acp.UnstableCreateElicitationResponse{Accept: &acp.UnstableCreateElicitationAccept{Action: "accept", Content: rep.content}}, nil
	}
}

// elicitationRun finds the run an elicitation belongs to: the session named
// in _meta, else the only session with a turn in flight.
func (d *Daemon) elicitationRun(meta map[string]any) *run {
	if id := metaString(meta, MetaSessionID); id != "" {
		return d.runFor(id)
	}
	if id := metaString(meta, "sessionId"); id != "" {
		return d.runFor(id)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var only *run
	for _, s := range d.sessions {
		if s.busy && s.current != nil {
			if only != nil {
				return nil
			}
			only = s.current
		}
	}
	return only
}

// The daemon offers the agent no file system and no terminal: tools run
// inside the agent (the built-in agent's shell is its own).
func (c *client) ReadTextFile(context.Context, acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return acp.ReadTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsReadTextFile)
}

// WriteTextFile is not offered (see ReadTextFile).
func (c *client) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return acp.WriteTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsWriteTextFile)
}

// CreateTerminal is not offered (see ReadTextFile).
func (c *client) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalCreate)
}

// KillTerminal is not offered.
func (c *client) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalKill)
}

// TerminalOutput is not offered.
func (c *client) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalOutput)
}

// ReleaseTerminal is not offered.
func (c *client) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalRelease)
}

// WaitForTerminalExit is not offered.
func (c *client) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalWaitForExit)
}

var _ = http.StatusOK
