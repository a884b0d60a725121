package builtinagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/cohort-dev/cohort/internal/idle"
)

// Defaults for Config fields left zero.
const (
	DefaultIdleTimeout = 60 * time.Second
	DefaultMaxSteps    = 32
	DefaultMaxRetries  = 2
)

// Keys of the `_meta` objects this agent reads and writes (see the package
// documentation).
const (
	MetaApprovalMode = "cohort.dev/approval_mode"
	MetaModel        = "cohort.dev/model"
	MetaCost         = "cohort.dev/cost"
	MetaSessionID    = "cohort.dev/session_id"
	MetaToolCallID   = "cohort.dev/tool_call_id"
	MetaTool         = "cohort.dev/tool"
)

// Approval modes, the values of MetaApprovalMode.
const (
	ModeManual    = "manual"
	ModeSelfDrive = "self-drive"
)

// ConfigModel is the id of the session config option (category model) that
// selects the session's model.
const ConfigModel = "model"

// Config configures the agent. The API key is only ever handed to the model
// client: it is not logged and not passed to shell commands.
type Config struct {
	// Model is the default model id of new sessions; DemoModelID when empty.
	Model string
	// BaseURL of the OpenAI-compatible endpoint ("…/v1"); the SDK's default
	// (api.openai.com) when empty.
	BaseURL string
	APIKey  string
	// WorkDir is where shell commands run when the client's session/new cwd
	// is not an existing directory; the process's working directory when empty.
	WorkDir string
	// StateDir, when set, keeps each session's history in a file so that
	// session/load works across restarts.
	StateDir string
	// SessionIdleTTL, with StateDir, is how long a session without a prompt
	// stays in memory (default 30 minutes): then only its file remains,
	// and session/load brings it back. It must exceed the client's own
	// bound (the intern daemon forgets idle sessions after 11 minutes and
	// loads them again), so a client never prompts a session the agent
	// forgot.
	SessionIdleTTL time.Duration
	// MaxSessions, with StateDir, bounds the sessions kept in memory
	// (default 512): past a quarter more, the least recently prompted
	// leave memory at once, as after SessionIdleTTL. It must exceed the
	// client's own bound (the intern daemon keeps at most 320), for the
	// reason SessionIdleTTL must.
	MaxSessions int
	// IdleTimeout bounds a model call's wait for its first byte and between
	// chunks.
	IdleTimeout time.Duration
	// MaxRetries of a model call that failed before streaming (connection
	// errors, 408, 409, 429, 5xx); zero means none (`cohort agent` uses
	// DefaultMaxRetries).
	MaxRetries int
	// ShellTimeout and MaxToolOutput bound one shell command.
	ShellTimeout  time.Duration
	MaxToolOutput int
	// MaxSteps bounds the model calls of one turn.
	MaxSteps int
	// Version is reported at initialize.
	Version string
	Logger  *slog.Logger
	// HTTPClient for the model upstream; the SDK's default when nil.
	HTTPClient *http.Client
}

func (c *Config) defaults() {
	if c.Model == "" {
		c.Model = DemoModelID
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.SessionIdleTTL <= 0 {
		c.SessionIdleTTL = 30 * time.Minute
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = 512
	}
	if c.MaxSteps <= 0 {
		c.MaxSteps = DefaultMaxSteps
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Serve speaks ACP as the agent over r and w until the client hangs up or ctx
// ends.
func Serve(ctx context.Context, cfg Config, r io.Reader, w io.Writer) error {
	a := New(cfg)
	// The SDK and the text fast path (wire.go) share the output.
	a.out = &lineWriter{w: w}
	// No SetLogger: it races with the connection's reader in SDK v0.13.0;
	// the SDK's few diagnostics go to slog's default logger.
	conn := acp.NewAgentSideConnection(a, a.out, r)
	a.SetConnection(conn)
	select {
	case <-conn.Done():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Agent is the built-in ACP agent. Create it with New and connect it with
// Serve (or acp.NewAgentSideConnection followed by SetConnection).
type Agent struct {
	cfg    Config
	remote Model
	// conn is set once, after the SDK has already started reading; ready
	// closes then, and handlers wait for it.
	conn      atomic.Pointer[acp.AgentSideConnection]
	ready     chan struct{}
	readyOnce sync.Once
	// out, set by Serve, is the connection's output, where text chunks are
	// written without the SDK (wire.go); nil otherwise.
	out *lineWriter

	mu       sync.Mutex
	sessions map[acp.SessionId]*session
	// mcpSpecs are the tool lists of the MCP servers seen (mcp.go).
	mcpSpecs map[string][]ToolSpec
	idle     *idle.Bound // forgets sessions idle past SessionIdleTTL, or past MaxSessions
}

var _ acp.Agent = (*Agent)(nil)
var _ acp.AgentLoader = (*Agent)(nil)

// New returns an agent; connect it before use.
func New(cfg Config) *Agent {
	cfg.defaults()
	a := &Agent{
		cfg: cfg,
		remote: NewOpenAIModel(OpenAIConfig{
			BaseURL: cfg.BaseURL, APIKey: cfg.APIKey, IdleTimeout: cfg.IdleTimeout,
			MaxRetries: cfg.MaxRetries, HTTPClient: cfg.HTTPClient,
		}),
		sessions: map[acp.SessionId]*session{},
		ready:    make(chan struct{}),
	}
	a.idle = &idle.Bound{TTL: cfg.SessionIdleTTL, Max: cfg.MaxSessions, Forget: a.forget}
	return a
}

// SetConnection attaches the connection the agent sends updates and requests on.
func (a *Agent) SetConnection(c *acp.AgentSideConnection) {
	a.conn.Store(c)
	a.readyOnce.Do(func() { close(a.ready) })
}

// client returns the connection to the client.
func (a *Agent) client() *acp.AgentSideConnection {
	<-a.ready
	return a.conn.Load()
}

// model returns the Model behind a model id.
func (a *Agent) model(id string) Model {
	if id == DemoModelID {
		return DemoModel{}
	}
	return a.remote
}

// session is one conversation.
type session struct {
	id acp.SessionId

	// turn serializes prompts: one turn at a time per session.
	turn sync.Mutex

	// mu guards the fields below.
	mu sync.Mutex
	// cwd is where shell commands run (and the sandbox's writable directory).
	cwd string
	// mode is the approval mode a prompt without one runs under.
	mode    string
	model   string
	history []Message
	// escalated: an allow_always grant lifted the sandbox and the asking for
	// the rest of the session. refused: a reject_always grant refuses the
	// shell without asking for the rest of the session. Neither applies to
	// self-drive prompts, and neither is persisted.
	escalated bool
	refused   bool
	// mcp are the tools of the MCP servers the client gave the session
	// (not persisted: the client gives them again on session/load).
	mcp []mcpTool
	// used is when the session was last created, loaded or prompted.
	used time.Time
	// saved is how many messages of history its journal holds; -1 until
	// this process first writes it (state.go). saveMu orders the saves.
	saved  int
	saveMu sync.Mutex
}

func (s *session) currentModel() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.model
}

// Initialize implements acp.Agent.
func (a *Agent) Initialize(ctx context.Context, p acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{
		ProtocolVersion: acp.ProtocolVersionNumber,
		AgentInfo:       &acp.Implementation{Name: "cohort-agent", Title: acp.Ptr("Cohort agent"), Version: a.cfg.Version},
		AgentCapabilities: acp.AgentCapabilities{
			// Text and resource links only (the baseline); no images, audio or
			// embedded resources. MCP servers over HTTP: their tools are
			// offered to the model (the intern daemon's http_request).
			LoadSession:     a.cfg.StateDir != "",
			McpCapabilities: acp.McpCapabilities{Http: true},
		},
		AuthMethods: []acp.AuthMethod{},
	}, nil
}

// Authenticate implements acp.Agent: no authentication methods are offered
// (the model credentials come from the agent's own configuration).
func (a *Agent) Authenticate(ctx context.Context, p acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

// NewSession implements acp.Agent. `_meta` may carry MetaApprovalMode (the
// session's default mode) and MetaModel (the session's model).
func (a *Agent) NewSession(ctx context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	mode, err := approvalMode(p.Meta, ModeManual)
	if err != nil {
		return acp.NewSessionResponse{}, err
	}
	model, err := modelMeta(p.Meta, a.cfg.Model)
	if err != nil {
		return acp.NewSessionResponse{}, err
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	s := &session{id: acp.SessionId("sess_" + hex.EncodeToString(raw[:])), cwd: a.workDir(p.Cwd), mode: mode, model: model,
		mcp: a.connectMCP(ctx, p.McpServers), used: time.Now(), saved: -1}
	a.startForgetting()
	a.mu.Lock()
	a.sessions[s.id] = s
	a.mu.Unlock()
	a.trim()
	if err := a.save(s); err != nil {
		a.cfg.Logger.Warn("agent: persist session", "session", s.id, "err", err)
	}
	a.cfg.Logger.Info("agent: session created", "session", s.id, "model", model, "mode", mode, "cwd", s.cwd)
	return acp.NewSessionResponse{SessionId: s.id, ConfigOptions: configOptions(model), Models: modelState(model)}, nil
}

// LoadSession implements acp.AgentLoader: it replays the stored conversation
// as user and agent message chunks, then answers. `_meta` may carry
// MetaApprovalMode and MetaModel as on session/new.
func (a *Agent) LoadSession(ctx context.Context, p acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	if a.cfg.StateDir == "" {
		return acp.LoadSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionLoad)
	}
	mode, err := approvalMode(p.Meta, ModeManual)
	if err != nil {
		return acp.LoadSessionResponse{}, err
	}
	// The client's model wins over the stored one: the intern's model may
	// have changed while the session slept.
	model, err := modelMeta(p.Meta, "")
	if err != nil {
		return acp.LoadSessionResponse{}, err
	}
	s, err := a.load(p.SessionId)
	if err != nil {
		return acp.LoadSessionResponse{}, err
	}
	a.mu.Lock()
	if old, ok := a.sessions[s.id]; ok {
		s = old // already live in this process: its memory is newer than the file
	} else {
		a.sessions[s.id] = s
	}
	a.mu.Unlock()
	remote := a.connectMCP(ctx, p.McpServers)
	a.startForgetting()
	a.trim()
	s.mu.Lock()
	s.mode = mode
	old := s.mcp
	s.mcp = remote
	s.used = time.Now()
	if p.Cwd != "" {
		s.cwd = a.workDir(p.Cwd)
	}
	if model != "" {
		s.model = model
	}
	history := append([]Message(nil), s.history...)
	model = s.model
	s.mu.Unlock()
	closeMCP(old) // the client's earlier connections for this session
	for _, m := range history {
		var u acp.SessionUpdate
		switch {
		case m.Role == "user":
			u = acp.UpdateUserMessageText(m.Content)
		case m.Role == "assistant" && m.Content != "":
			u = acp.UpdateAgentMessageText(m.Content)
		default:
			continue
		}
		if err := a.client().SessionUpdate(ctx, acp.SessionNotification{SessionId: s.id, Update: u, Meta: map[string]any{MetaModel: model}}); err != nil {
			return acp.LoadSessionResponse{}, err
		}
	}
	return acp.LoadSessionResponse{ConfigOptions: configOptions(model), Models: modelState(model)}, nil
}

// workDir picks the directory shell commands run in.
func (a *Agent) workDir(cwd string) string {
	for _, d := range []string{cwd, a.cfg.WorkDir} {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return filepath.Clean(d)
		}
	}
	wd, _ := os.Getwd()
	return wd
}

func (a *Agent) session(id acp.SessionId) (*session, error) {
	a.mu.Lock()
	s, ok := a.sessions[id]
	a.mu.Unlock()
	if ok {
		return s, nil
	}
	// Forgotten while idle (or from an earlier process): its file brings
	// it back, without the MCP tools a session/load would give it.
	if a.cfg.StateDir != "" {
		if s, err := a.load(id); err == nil {
			s.used = time.Now()
			a.mu.Lock()
			if old, ok := a.sessions[id]; ok {
				s = old
			} else {
				a.sessions[id] = s
			}
			a.mu.Unlock()
			return s, nil
		}
	}
	return nil, acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("unknown session %q", id)})
}

// SetSessionConfigOption implements acp.Agent: the `model` option accepts
// any model id the upstream knows (the list offered is only a hint).
func (a *Agent) SetSessionConfigOption(ctx context.Context, p acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	if p.ValueId == nil || p.ValueId.ConfigId != ConfigModel {
		return acp.SetSessionConfigOptionResponse{}, acp.NewInvalidParams(map[string]any{"error": "the only config option is \"model\""})
	}
	model, err := a.setModel(p.ValueId.SessionId, string(p.ValueId.Value))
	if err != nil {
		return acp.SetSessionConfigOptionResponse{}, err
	}
	return acp.SetSessionConfigOptionResponse{ConfigOptions: configOptions(model)}, nil
}

// UnstableSetSessionModel implements the unstable session/set_model method,
// the older way clients choose a model.
func (a *Agent) UnstableSetSessionModel(ctx context.Context, p acp.UnstableSetSessionModelRequest) (acp.UnstableSetSessionModelResponse, error) {
	_, err := a.setModel(p.SessionId, string(p.ModelId))
	return acp.UnstableSetSessionModelResponse{}, err
}

func (a *Agent) setModel(id acp.SessionId, model string) (string, error) {
	if err := validModel(model); err != nil {
		return "", err
	}
	s, err := a.session(id)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	s.model = model
	s.mu.Unlock()
	if err := a.save(s); err != nil {
		a.cfg.Logger.Warn("agent: persist session", "session", s.id, "err", err)
	}
	return model, nil
}

func validModel(model string) error {
	if model == "" || len(model) > 256 || strings.ContainsAny(model, "\x00\n\r") {
		return acp.NewInvalidParams(map[string]any{"error": "model id must be 1 to 256 characters on one line"})
	}
	return nil
}

func configOptions(model string) []acp.SessionConfigOption {
	opts := acp.SessionConfigSelectOptionsUngrouped{{Name: model, Value: acp.SessionConfigValueId(model)}}
	if model != DemoModelID {
		opts = append(opts, acp.SessionConfigSelectOption{Name: DemoModelID + " (offline)", Value: DemoModelID})
	}
	return []acp.SessionConfigOption{{Select: &acp.SessionConfigOptionSelect{
		Id:           ConfigModel,
		Name:         "Model",
		Description:  acp.Ptr("Any model id the OpenAI-compatible upstream serves, or cohort/demo (offline)."),
		Category:     acp.Ptr(acp.SessionConfigOptionCategoryModel),
		CurrentValue: acp.SessionConfigValueId(model),
		Options:      acp.SessionConfigSelectOptions{Ungrouped: &opts},
		Type:         "select",
	}}}
}

func modelState(model string) *acp.SessionModelState {
	return &acp.SessionModelState{CurrentModelId: acp.ModelId(model), AvailableModels: []acp.ModelInfo{{ModelId: acp.ModelId(model), Name: model}}}
}

// approvalMode reads MetaApprovalMode from a `_meta` object.
func approvalMode(meta map[string]any, def string) (string, error) {
	v, ok := meta[MetaApprovalMode]
	if !ok || v == nil {
		return def, nil
	}
	s, _ := v.(string)
	switch s {
	case ModeManual, ModeSelfDrive:
		return s, nil
	}
	return "", acp.NewInvalidParams(map[string]any{"error": fmt.Sprintf("_meta[%q] must be %q or %q", MetaApprovalMode, ModeManual, ModeSelfDrive)})
}

func modelMeta(meta map[string]any, def string) (string, error) {
	v, ok := meta[MetaModel]
	if !ok || v == nil {
		return def, nil
	}
	s, _ := v.(string)
	if err := validModel(s); err != nil {
		return "", err
	}
	return s, nil
}

// Cancel implements acp.Agent. The connection has already cancelled the
// session's running prompt, whose context every wait of the turn (model
// stream, permission, question, shell command) watches.
func (a *Agent) Cancel(ctx context.Context, p acp.CancelNotification) error { return nil }

// SetSessionMode implements acp.Agent; the agent offers no modes (the
// approval mode travels in `_meta`).
func (a *Agent) SetSessionMode(ctx context.Context, p acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetMode)
}

// ListSessions implements acp.Agent; not offered.
func (a *Agent) ListSessions(ctx context.Context, p acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionList)
}

// ResumeSession implements acp.Agent; not offered.
func (a *Agent) ResumeSession(ctx context.Context, p acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionResume)
}

// CloseSession implements acp.Agent; not offered.
func (a *Agent) CloseSession(ctx context.Context, p acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionClose)
}

// errCancelled ends a turn with stop reason cancelled.
var errCancelled = errors.New("turn cancelled")

// startForgetting starts, once, the sweep that forgets idle sessions (only
// with a state directory: without one a forgotten session would be lost).
func (a *Agent) startForgetting() {
	if a.cfg.StateDir == "" {
		return
	}
	a.idle.Sweep()
}

// trim tells the bound how many sessions there are (idle.Bound.Trim), with
// a state directory only: their files bring them back.
func (a *Agent) trim() {
	if a.cfg.StateDir == "" {
		return
	}
	a.mu.Lock()
	n := len(a.sessions)
	a.mu.Unlock()
	a.idle.Trim(n)
}

// forget drops the sessions without a prompt since cutoff and, when
// extra > 0, that many more of the least recently prompted (none with a
// prompt running), and closes their MCP connections; their files stay.
// idle.Bound calls it: a sweep of the sessions idle for SessionIdleTTL, a
// trim past MaxSessions. It returns how many it dropped.
func (a *Agent) forget(cutoff time.Time, extra int) int {
	a.mu.Lock()
	idle := make([]*session, 0, len(a.sessions))
	for _, s := range a.sessions {
		idle = append(idle, s)
	}
	a.mu.Unlock()
	if extra > 0 {
		used := make(map[*session]time.Time, len(idle))
		for _, s := range idle {
			s.mu.Lock()
			used[s] = s.used
			s.mu.Unlock()
		}
		slices.SortFunc(idle, func(x, y *session) int { return used[x].Compare(used[y]) })
	}
	forgotten := 0
	for _, s := range idle {
		if !s.turn.TryLock() { // a prompt is running
			continue
		}
		s.mu.Lock()
		stale := s.used.Before(cutoff) || forgotten < extra
		tools := s.mcp
		if stale {
			s.mcp = nil
		}
		s.mu.Unlock()
		if stale {
			a.mu.Lock()
			if a.sessions[s.id] == s {
				delete(a.sessions, s.id)
				forgotten++
			}
			a.mu.Unlock()
			closeMCP(tools)
		}
		s.turn.Unlock()
	}
	if forgotten > 0 {
		a.mu.Lock()
		live := len(a.sessions)
		a.mu.Unlock()
		a.cfg.Logger.Info("agent: idle sessions left memory", "forgotten", forgotten, "live", live)
		// Give what they held back to the kernel now (at most once a
		// sweep): the Go runtime would keep it for minutes.
		debug.FreeOSMemory()
	}
	return forgotten
}

// closeMCP closes the connections behind tools (several tools share one).
func closeMCP(tools []mcpTool) {
	var seen []*mcpConn
	for _, t := range tools {
		if t.conn != nil && !slices.Contains(seen, t.conn) {
			seen = append(seen, t.conn)
			t.conn.close()
		}
	}
}
