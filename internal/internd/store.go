package internd

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
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
	rec, _, err := f.read(id)
	if err != nil || rec == nil {
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

// fileStore keeps session records in <dir>/sessions, one journal per
// session (<hash>.jsonl): each update appends the whole record as one
// line, and the last complete line is the record. Now and then the journal
// is compacted to its last record (a new file renamed over it).
//
// An append, not a rewrite: replacing the file by rename on every update
// made ext4 allocate and queue the new file's blocks at once and discard
// the old ones, about 0.5 ms of system CPU per update on the bench
// machine, two updates per new-session turn. The record is still written
// before the caller hears of it (no fsync, as before); a line cut short
// by a crash has no newline and is not read.
type fileStore struct{ dir string }

// compactAt is the journal size past which an update compacts it rather
// than append: 64 KiB, or four records when records are larger.
func compactAt(record int) int64 { return max(64<<10, 4*int64(record)) }

func newFileStore(dataDir string) (*fileStore, error) {
	dir := filepath.Join(dataDir, "sessions")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &fileStore{dir: dir}, nil
}

// path names a session's journal by a hash of its id: ids are
// client-chosen strings and must never become path components.
func (f *fileStore) path(id string) string { return f.name(id, ".jsonl") }

// legacyPath is the whole-record file earlier daemons wrote; it is read
// until the session's first update moves it to a journal.
func (f *fileStore) legacyPath(id string) string { return f.name(id, ".json") }

func (f *fileStore) name(id, ext string) string {
	h := sha256.Sum256([]byte(id))
	return filepath.Join(f.dir, hex.EncodeToString(h[:16])+ext)
}

// openRegular opens a session file, which must be a regular file: the
// directory is the intern's, and a command may plant a FIFO there (whose
// open or read would block the daemon, under its lock, until someone
// writes), a symlink (to a file the daemon may read and the command not),
// or a device. It opens without following a symlink and without blocking,
// refuses whatever fstat says is not a regular file, and only then clears
// O_NONBLOCK.
func openRegular(p string, flag int) (*os.File, error) {
	file, err := os.OpenFile(p, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("session file %s is a symbolic link: refused", filepath.Base(p))
		}
		if errors.Is(err, syscall.ENXIO) {
			// O_WRONLY|O_NONBLOCK on a FIFO nobody reads.
			return nil, fmt.Errorf("session file %s is not a regular file: refused", filepath.Base(p))
		}
		return nil, err
	}
	st, err := file.Stat()
	if err != nil {
		file.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		file.Close()
		return nil, fmt.Errorf("session file %s is not a regular file (%s): refused", filepath.Base(p), fileKind(st.Mode()))
	}
	if rc, err := file.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { syscall.SetNonblock(int(fd), false) })
	}
	return file, nil
}

// fileKind names a file's type for an error.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return m.Type().String()
}

// readRegular reads a whole session file (see openRegular).
func readRegular(p string) ([]byte, error) {
	file, err := openRegular(p, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return io.ReadAll(file)
}

// read returns the session's record as stored (nil when there is none) and
// the size of its journal (-1 when the journal needs rewriting: absent, or
// ending in a torn line).
func (f *fileStore) read(id string) (*sessionRecord, int64, error) {
	b, err := readRegular(f.path(id))
	size := int64(len(b))
	if errors.Is(err, os.ErrNotExist) {
		b, err = readRegular(f.legacyPath(id))
		size = -1
		if errors.Is(err, os.ErrNotExist) {
			return nil, -1, nil
		}
	} else if len(b) > 0 && b[len(b)-1] != '\n' {
		size = -1 // an update cut short: the next one rewrites the journal
	}
	if err != nil {
		return nil, -1, err
	}
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		line := b[i+1:]
		if size < 0 && json.Unmarshal(line, new(sessionRecord)) != nil {
			b = b[:i] // the torn line: the one before it is the record
			if i = bytes.LastIndexByte(b, '\n'); i >= 0 {
				line = b[i+1:]
			} else {
				line = b
			}
		}
		b = line
	}
	var rec sessionRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.ID != id {
		return nil, size, errors.Join(fmt.Errorf("session file %s unreadable", filepath.Base(f.path(id))), err)
	}
	return &rec, size, nil
}

// save stores rec: appended to its journal of size bytes, or (size < 0, or
// past compactAt) written as a new journal renamed over the old one.
func (f *fileStore) save(rec *sessionRecord, size int64) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	p := f.path(rec.ID)
	if size >= 0 && size+int64(len(b)) <= compactAt(len(b)) {
		w, err := openRegular(p, os.O_WRONLY|os.O_APPEND)
		if err == nil {
			_, err = w.Write(b)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			return err
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
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
	if err := os.Rename(tmp.Name(), p); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	os.Remove(f.legacyPath(rec.ID)) // moved to the journal, if it was there
	return nil
}

// update applies fn to the session's record as stored (a fresh one if
// none is) and saves it. The daemon keeps no history in memory; a session
// has one turn at a time, so its updates never race.
func (f *fileStore) update(id string, fn func(*sessionRecord)) error {
	rec, size, err := f.read(id)
	if rec == nil || err != nil {
		rec, size = &sessionRecord{ID: id}, -1
	}
	fn(rec)
	return f.save(rec, size)
}

// count is the number of sessions kept (their files).
func (f *fileStore) count() int {
	entries, err := os.ReadDir(f.dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".jsonl" || ext == ".json") {
			n++
		}
	}
	return n
}

// load reads a session's record without its history (nil when there is
// none).
func (f *fileStore) load(id string) (*sessionRecord, error) {
	rec, _, err := f.read(id)
	if rec == nil || err != nil {
		return nil, err
	}
	rec.Turns = nil // history stays on disk
	return rec, nil
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
