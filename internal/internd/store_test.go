package internd

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSessionFileNotRegular: a command of the jail may plant a FIFO, a
// symlink or a directory where a session's journal goes (the sessions
// directory is the intern's). Reading, asking and updating that session
// neither hang (a FIFO's open and read block until someone writes) nor
// follow the link: each answers at once, the read with an error naming
// the file and what it is, and the update replaces the planted file with
// a journal of its own.
func TestSessionFileNotRegular(t *testing.T) {
	f, err := newFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	secret := t.TempDir() + "/secret"
	if err := os.WriteFile(secret, []byte(`{"id":"link","acp_session_id":"stolen"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plant := map[string]func(p string) error{
		"fifo":        func(p string) error { return syscall.Mkfifo(p, 0o666) },
		"legacy-fifo": func(p string) error { return syscall.Mkfifo(p, 0o666) },
		"link":        func(p string) error { return os.Symlink(secret, p) },
		"dir":         func(p string) error { return os.Mkdir(p, 0o755) },
	}
	want := map[string]string{"fifo": "a FIFO", "legacy-fifo": "a FIFO", "link": "symbolic link", "dir": "a directory"}
	for id, mk := range plant {
		p := f.path(id)
		if id == "legacy-fifo" {
			p = f.legacyPath(id)
		}
		if err := mk(p); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := f.load(id); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), want[id]) {
				t.Errorf("%s: load: %v, want a refusal naming %q", id, err, want[id])
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: load hangs on the planted file", id)
		}
		go func() {
			if f.asked(id, "ia") {
				done <- nil
				return
			}
			done <- f.update(id, func(r *sessionRecord) { r.addTurn(turnRecord{Prompt: "p"}) })
		}()
		select {
		case err := <-done:
			if err != nil && id != "dir" {
				t.Errorf("%s: update: %v", id, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: update hangs on the planted file", id)
		}
		if id == "dir" {
			continue // a directory is not renamed over: the update fails, and says so
		}
		rec, err := f.load(id)
		if err != nil || rec == nil || rec.ACPSessionID == "stolen" {
			t.Errorf("%s: after the update: %+v %v, want the daemon's own record", id, rec, err)
		}
	}
	if b, _ := os.ReadFile(secret); !strings.Contains(string(b), "stolen") {
		t.Errorf("the symlink's target was written: %q", b)
	}
}
