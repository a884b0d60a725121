package internd

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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

// sessionFile is an open session file: a bare descriptor, read and
// written with plain system calls. An *os.File of a regular file opened
// with O_NONBLOCK costs five more calls per open (fcntl twice to try the
// poller, epoll_ctl refused, fcntl twice more), and under gVisor's ptrace
// platform every call is a round trip to the Sentry (ADR 0996).
type sessionFile struct {
	fd   int
	name string
	size int64 // at open
}

// openRegular opens a session file, which must be a regular file: the
// directory is the intern's, and a command may plant a FIFO there (whose
// open or read would block the daemon, under its lock, until someone
// writes), a symlink (to a file the daemon may read and the command not),
// or a device. It opens without following a symlink and without blocking,
// and refuses whatever fstat says is not a regular file. O_NONBLOCK stays
// set: it has no effect on a regular file's reads and writes (open(2)).
func openRegular(p string, flag int) (*sessionFile, error) {
	var fd int
	var err error
	for {
		fd, err = syscall.Open(p, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		switch {
		case errors.Is(err, syscall.ELOOP):
			return nil, fmt.Errorf("session file %s is a symbolic link: refused", filepath.Base(p))
		case errors.Is(err, syscall.ENXIO):
			// O_WRONLY|O_NONBLOCK on a FIFO nobody reads.
			return nil, fmt.Errorf("session file %s is not a regular file: refused", filepath.Base(p))
		case errors.Is(err, syscall.EISDIR):
			return nil, fmt.Errorf("session file %s is not a regular file (a directory): refused", filepath.Base(p))
		}
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	file := &sessionFile{fd: fd, name: p}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		file.close()
		return nil, &fs.PathError{Op: "fstat", Path: p, Err: err}
	}
	file.size = st.Size
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		file.close()
		return nil, fmt.Errorf("session file %s is not a regular file (%s): refused", filepath.Base(p), fileKind(st.Mode))
	}
	return file, nil
}

func (f *sessionFile) close() error { return syscall.Close(f.fd) }

// readAll reads the file from its start to its end: one read, of the
// size fstat gave at open. A shorter read reads on to the end; a file
// grown since is read as it was at open (the daemon is its only writer).
func (f *sessionFile) readAll() ([]byte, error) {
	b := make([]byte, 0, f.size+512)
	for {
		if len(b) == cap(b) {
			b = slices.Grow(b, cap(b))
		}
		n, err := syscall.Read(f.fd, b[len(b):cap(b)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return b, &fs.PathError{Op: "read", Path: f.name, Err: err}
		}
		b = b[:len(b)+n]
		if n == 0 || int64(len(b)) == f.size {
			return b, nil
		}
	}
}

// write writes all of b (with O_APPEND, at the file's end).
func (f *sessionFile) write(b []byte) error {
	for len(b) > 0 {
		n, err := syscall.Write(f.fd, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return &fs.PathError{Op: "write", Path: f.name, Err: err}
		}
		b = b[n:]
	}
	return nil
}

// fileKind names a file's type (its stat mode) for an error.
func fileKind(m uint32) string {
	switch m & syscall.S_IFMT {
	case syscall.S_IFIFO:
		return "a FIFO"
	case syscall.S_IFSOCK:
		return "a socket"
	case syscall.S_IFCHR, syscall.S_IFBLK:
		return "a device"
	case syscall.S_IFDIR:
		return "a directory"
	}
	return fmt.Sprintf("mode %#o", m&syscall.S_IFMT)
}

// readRegular reads a whole session file (see openRegular).
func readRegular(p string) ([]byte, error) {
	file, err := openRegular(p, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer file.close()
	return file.readAll()
}

// stored is a session as read for an update.
type stored struct {
	rec  *sessionRecord // nil when there is none
	size int64          // the journal's size; -1 when it needs rewriting
	// journal is the journal, open for appending when the read had it
	// opened so (update): one open for the read and the append.
	journal *sessionFile
	// noLegacy: the legacy file was looked for and is not there, so a new
	// journal need not remove it.
	noLegacy bool
}

// read returns the session's record as stored (nil when there is none) and
// the size of its journal (-1 when the journal needs rewriting: absent, or
// ending in a torn line).
func (f *fileStore) read(id string) (*sessionRecord, int64, error) {
	st, err := f.open(id, os.O_RDONLY)
	if st.journal != nil {
		st.journal.close()
	}
	return st.rec, st.size, err
}

// open reads the session's record; with flag O_RDWR|O_APPEND the journal
// stays open for the update's append (the caller closes it).
func (f *fileStore) open(id string, flag int) (stored, error) {
	var st stored
	j, err := openRegular(f.path(id), flag)
	var b []byte
	if err == nil {
		b, err = j.readAll()
		if err != nil {
			j.close()
			return stored{size: -1}, err
		}
		st.journal, st.size = j, int64(len(b))
		if len(b) > 0 && b[len(b)-1] != '\n' {
			st.size = -1 // an update cut short: the next one rewrites the journal
		}
	} else if errors.Is(err, os.ErrNotExist) {
		b, err = readRegular(f.legacyPath(id))
		st.size = -1
		if errors.Is(err, os.ErrNotExist) {
			st.noLegacy = true
			return st, nil
		}
	}
	if err != nil {
		return stored{size: -1}, err
	}
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		line := b[i+1:]
		if st.size < 0 && json.Unmarshal(line, new(sessionRecord)) != nil {
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
		return st, errors.Join(fmt.Errorf("session file %s unreadable", filepath.Base(f.path(id))), err)
	}
	st.rec = &rec
	return st, nil
}

// save stores rec: appended to st's open journal when it is sound and
// stays under compactAt, else written as a new journal renamed over the
// old one. It closes st's journal.
func (f *fileStore) save(rec *sessionRecord, st stored) error {
	b, err := json.Marshal(rec)
	if err != nil {
		if st.journal != nil {
			st.journal.close()
		}
		return err
	}
	b = append(b, '\n')
	if j := st.journal; j != nil {
		if st.size >= 0 && st.size+int64(len(b)) <= compactAt(len(b)) {
			err := j.write(b)
			if cerr := j.close(); err == nil {
				err = cerr
			}
			return err
		}
		j.close()
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
	// rename(2) itself, not os.Rename, whose lstat of the target first
	// only words the error for a directory there (rename fails either way).
	if err := syscall.Rename(tmp.Name(), p); err != nil {
		os.Remove(tmp.Name())
		return &os.LinkError{Op: "rename", Old: tmp.Name(), New: p, Err: err}
	}
	if !st.noLegacy {
		os.Remove(f.legacyPath(rec.ID)) // moved to the journal, if it was there
	}
	return nil
}

// update applies fn to the session's record as stored (a fresh one if
// none is) and saves it. The daemon keeps no history in memory; a session
// has one turn at a time, so its updates never race.
//
// One open serves the read and the append (O_RDWR|O_APPEND: the append
// goes to the end whatever was read), where a read and an append each
// opened the file: with the reads sized to the file, a continued turn's
// update is six system calls instead of about twenty (ADR 0996).
func (f *fileStore) update(id string, fn func(*sessionRecord)) error {
	st, err := f.open(id, os.O_RDWR|os.O_APPEND)
	if st.rec == nil || err != nil {
		st.rec, st.size = &sessionRecord{ID: id}, -1
	}
	fn(st.rec)
	return f.save(st.rec, st)
}

// create stores a session the daemon has just named (a fresh random id):
// there is nothing on disk to read, journal or legacy, so it writes the
// journal in place, made with O_EXCL (four failed opens, a temporary
// file's five calls of *os.File set-up, the rename and its lstat fewer
// per new session). A write cut short leaves a torn line, read as no
// record, as a crash before the rename left none. A file already there
// (planted) is replaced by rename instead.
func (f *fileStore) create(rec *sessionRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	p := f.path(rec.ID)
	fd, err := syscall.Open(p, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return f.save(rec, stored{size: -1, noLegacy: true})
	}
	j := &sessionFile{fd: fd, name: p}
	err = j.write(append(b, '\n'))
	if cerr := j.close(); err == nil {
		err = cerr
	}
	return err
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
