package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	acp "github.com/coder/acp-go-sdk"
)

// sessionIDPattern is what NewSession hands out; LoadSession refuses anything
// else, so a session id can never name a file outside the state directory.
var sessionIDPattern = regexp.MustCompile(`^sess_[0-9a-f]{32}$`)

// stored is a session's file in the state directory.
type stored struct {
	Model   string    `json:"model"`
	Cwd     string    `json:"cwd"`
	History []Message `json:"history"`
}

// save writes the session's file atomically; a no-op without a state dir.
func (a *Agent) save(s *session) error {
	if a.cfg.StateDir == "" {
		return nil
	}
	s.mu.Lock()
	b, err := json.Marshal(stored{Model: s.model, Cwd: s.cwd, History: s.history})
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(a.cfg.StateDir, ".session-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(a.cfg.StateDir, string(s.id)+".json"))
}

// load reads a stored session.
func (a *Agent) load(id acp.SessionId) (*session, error) {
	notFound := &acp.RequestError{Code: -32002, Message: fmt.Sprintf("session %q not found", id)}
	if !sessionIDPattern.MatchString(string(id)) {
		return nil, notFound
	}
	b, err := os.ReadFile(filepath.Join(a.cfg.StateDir, string(id)+".json"))
	if os.IsNotExist(err) {
		return nil, notFound
	}
	if err != nil {
		return nil, acp.NewInternalError(map[string]any{"error": "cannot read the session's file"})
	}
	var st stored
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, acp.NewInternalError(map[string]any{"error": "the session's file is damaged"})
	}
	if st.Model == "" {
		st.Model = a.cfg.Model
	}
	return &session{id: id, cwd: a.workDir(st.Cwd), mode: ModeManual, model: st.Model, history: st.History}, nil
}
