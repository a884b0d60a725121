package builtinagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"syscall"

	acp "github.com/coder/acp-go-sdk"
)

// sessionIDPattern is what NewSession hands out; LoadSession refuses anything
// else, so a session id can never name a file outside the state directory.
var sessionIDPattern = regexp.MustCompile(`^sess_[0-9a-f]{32}$`)

// stored is a session's file in the state directory as an earlier agent
// wrote it (<id>.json, rewritten whole on every save); it is still read.
type stored struct {
	Model   string    `json:"model"`
	Cwd     string    `json:"cwd"`
	History []Message `json:"history"`
}

// journalRecord is one line of a session's journal (<id>.jsonl). Each save
// appends one: the session's model and directory, and its history from
// message From on (what the file does not hold yet). Replaying the lines
// in order rebuilds the history.
//
// An append, not a rewrite: replacing a file by rename (or truncating it)
// made ext4 allocate and queue the new file's blocks at once and discard
// the old ones — about 0.5 ms of system CPU per save on the bench machine,
// four saves per new-session turn between the agent and the daemon. An
// append costs a few microseconds and is as durable (written before the
// turn goes on; no fsync, as before). A line cut short by a crash has no
// newline and is ignored, so a record is all there or not at all.
type journalRecord struct {
	Model string    `json:"model"`
	Cwd   string    `json:"cwd"`
	From  int       `json:"from"`
	Add   []Message `json:"add"`
}

func (a *Agent) journalPath(id acp.SessionId) string {
	return filepath.Join(a.cfg.StateDir, string(id)+".jsonl")
}

// save appends the session's new history to its journal; a no-op without a
// state dir.
func (a *Agent) save(s *session) error {
	if a.cfg.StateDir == "" {
		return nil
	}
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	s.mu.Lock()
	from := min(max(s.saved, 0), len(s.history))
	rec := journalRecord{Model: s.model, Cwd: s.cwd, From: from, Add: s.history[from:]}
	b, err := json.Marshal(rec)
	n := len(s.history)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	flags := os.O_WRONLY | os.O_APPEND
	if s.saved < 0 {
		flags |= os.O_CREATE
	}
	b = append(b, '\n')
	err = appendFile(a.journalPath(s.id), flags, b)
	if flags&os.O_CREATE != 0 && errors.Is(err, fs.ErrNotExist) {
		// The first save of this session by this process: the directory
		// may not exist yet (made when missing, not looked for first).
		if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
			return err
		}
		err = appendFile(a.journalPath(s.id), flags, b)
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.saved = n
	s.mu.Unlock()
	return nil
}

// appendFile writes b to the file at path, opened with flags (O_APPEND), in
// plain system calls: open, write, close. An *os.File costs five more per
// open (fcntl twice to try the poller on what is a regular file, an
// epoll_ctl refused, fcntl twice more), and under gVisor's ptrace platform
// each is a round trip to the Sentry, on every turn (ADR 0996).
func appendFile(path string, flags int, b []byte) error {
	var fd int
	var err error
	for {
		fd, err = syscall.Open(path, flags|syscall.O_CLOEXEC, 0o600)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	for len(b) > 0 && err == nil {
		var n int
		n, err = syscall.Write(fd, b)
		if err == syscall.EINTR {
			err = nil
			continue
		}
		b = b[max(n, 0):]
	}
	if cerr := syscall.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return &fs.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// load reads a stored session: its journal, else the whole-file format of
// earlier agents (its next save then writes the full history).
func (a *Agent) load(id acp.SessionId) (*session, error) {
	notFound := &acp.RequestError{Code: -32002, Message: fmt.Sprintf("session %q not found", id)}
	if !sessionIDPattern.MatchString(string(id)) {
		return nil, notFound
	}
	var st stored
	saved := 0
	b, err := os.ReadFile(a.journalPath(id))
	switch {
	case err == nil:
		if i := bytes.LastIndexByte(b, '\n'); i < len(b)-1 {
			// A save cut short: cut it off, or the next append would
			// continue its line.
			if err := os.Truncate(a.journalPath(id), int64(i+1)); err != nil {
				return nil, acp.NewInternalError(map[string]any{"error": "cannot repair the session's file"})
			}
			b = b[:i+1]
		}
		if st, err = replayJournal(b); err != nil {
			return nil, acp.NewInternalError(map[string]any{"error": "the session's file is damaged"})
		}
		saved = len(st.History)
	case os.IsNotExist(err):
		b, err = os.ReadFile(filepath.Join(a.cfg.StateDir, string(id)+".json"))
		if os.IsNotExist(err) {
			return nil, notFound
		}
		if err != nil {
			return nil, acp.NewInternalError(map[string]any{"error": "cannot read the session's file"})
		}
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, acp.NewInternalError(map[string]any{"error": "the session's file is damaged"})
		}
		// saved 0 and the journal absent: the next save creates the
		// journal with the whole history.
		saved = -1
	default:
		return nil, acp.NewInternalError(map[string]any{"error": "cannot read the session's file"})
	}
	if st.Model == "" {
		st.Model = a.cfg.Model
	}
	return &session{id: id, cwd: a.workDir(st.Cwd), mode: ModeManual, model: st.Model, history: st.History, saved: saved}, nil
}

// replayJournal rebuilds a session from its journal's complete lines.
func replayJournal(b []byte) (stored, error) {
	var st stored
	if len(b) == 0 {
		return st, errors.New("empty journal")
	}
	for line := range bytes.Lines(b) {
		var rec journalRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			return st, err
		}
		if rec.From < 0 || rec.From > len(st.History) {
			return st, fmt.Errorf("a record starts at message %d of %d", rec.From, len(st.History))
		}
		st.Model, st.Cwd = rec.Model, rec.Cwd
		st.History = append(st.History[:rec.From:rec.From], rec.Add...)
	}
	return st, nil
}
