package internd

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Bounds on what a session keeps on disk: its history is a record for the
// operator and for agents that cannot load sessions, not a full transcript.
const (
	maxHistoryTurns = 50
	maxHistoryText  = 16 << 10
)

// sessionRecord is one session as persisted: one small JSON file per
// session, so a turn rewrites only its own session's file.
type sessionRecord struct {
	ID string `json:"id"`
	// ACPSessionID is the agent's id for the session (ours maps to it).
	ACPSessionID string       `json:"acp_session_id"`
	CreatedAt    time.Time    `json:"created_at"`
	UpdatedAt    time.Time    `json:"updated_at"`
	Turns        []turnRecord `json:"turns"`
	// Asked holds the ids of the session's last interactions, written
	// before each question reaches the caller: a reply that outlived the
	// daemon that asked (a restart) is then "no longer waiting" (409),
	// not "unknown" (404).
	Asked []string `json:"asked,omitempty"`
}

// maxAsked bounds Asked.
const maxAsked = 64

// asked reports whether the stored session once asked interaction ia.
func (f *fileStore) asked(id, ia string) bool {
	b, err := os.ReadFile(f.path(id))
	if err != nil {
		return false
	}
	var rec sessionRecord
	if json.Unmarshal(b, &rec) != nil || rec.ID != id {
		return false
	}
	for _, a := range rec.Asked {
		if a == ia {
			return true
		}
	}
	return false
}

// turnRecord is one run's prompt and outcome.
type turnRecord struct {
	RunID  string    `json:"run_id"`
	Prompt string    `json:"prompt"`
	Reply  string    `json:"reply"`
	End    string    `json:"end"`
	At     time.Time `json:"at"`
}

// fileStore keeps session records in <dir>/sessions.
type fileStore struct{ dir string }

func newFileStore(dataDir string) (*fileStore, error) {
	dir := filepath.Join(dataDir, "sessions")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &fileStore{dir: dir}, nil
}

// path names a session's file by a hash of its id: ids are client-chosen
// strings and must never become path components.
func (f *fileStore) path(id string) string {
	h := sha256.Sum256([]byte(id))
	return filepath.Join(f.dir, hex.EncodeToString(h[:16])+".json")
}

// save writes rec atomically (temporary file, then rename).
func (f *fileStore) save(rec *sessionRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	p := f.path(rec.ID)
	tmp, err := os.CreateTemp(f.dir, ".tmp-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), p)
}

// update applies fn to the session's record as stored (a fresh one if
// none is) and saves it. The daemon keeps no history in memory; a session
// has one turn at a time, so its updates never race.
func (f *fileStore) update(id string, fn func(*sessionRecord)) error {
	rec := &sessionRecord{ID: id}
	if b, err := os.ReadFile(f.path(id)); err == nil {
		if json.Unmarshal(b, rec) != nil || rec.ID != id {
			rec = &sessionRecord{ID: id}
		}
	}
	fn(rec)
	return f.save(rec)
}

// count is the number of sessions kept (their files).
func (f *fileStore) count() int {
	entries, err := os.ReadDir(f.dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if !e.IsDir() && filepath.Ext(e.Name()) == ".json" {
			n++
		}
	}
	return n
}

// load reads a session's record without its history (nil when there is
// none).
func (f *fileStore) load(id string) (*sessionRecord, error) {
	b, err := os.ReadFile(f.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec sessionRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.ID != id {
		return nil, errors.Join(fmt.Errorf("session file %s unreadable", filepath.Base(f.path(id))), err)
	}
	rec.Turns = nil // history stays on disk
	return &rec, nil
}

// addTurn appends a turn to rec, keeping the history bounded.
func (rec *sessionRecord) addTurn(t turnRecord) {
	t.Prompt = truncate(t.Prompt, maxHistoryText)
	t.Reply = truncate(t.Reply, maxHistoryText)
	rec.Turns = append(rec.Turns, t)
	if n := len(rec.Turns) - maxHistoryTurns; n > 0 {
		rec.Turns = append([]turnRecord(nil), rec.Turns[n:]...)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary.
	for n > 0 && (s[n]&0xC0) == 0x80 {
		n--
	}
	return s[:n]
}
