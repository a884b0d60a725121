package internd

import (
	"os"
	"strings"
	"testing"
)

// TestSessionJournalStore: updates append the whole record to the
// session's journal; the last complete line is the record, a torn last
// line (an update cut short) is not read and the next update rewrites the
// journal; a record in the whole-file format of earlier daemons is read
// and moved to a journal by its first update; a journal past its bound is
// compacted to its last record.
func TestSessionJournalStore(t *testing.T) {
	f, err := newFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lines := func(id string) []string {
		b, err := os.ReadFile(f.path(id))
		if err != nil {
			t.Fatal(err)
		}
		return strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
	}
	for i, reply := range []string{"a", "b", "c"} {
		if err := f.update("s", func(r *sessionRecord) { r.addTurn(turnRecord{Prompt: "p", Reply: reply}) }); err != nil {
			t.Fatal(err)
		}
		if n := len(lines("s")); n != i+1 {
			t.Fatalf("after %d updates, %d lines", i+1, n)
		}
	}
	rec, _, err := f.read("s")
	if err != nil || len(rec.Turns) != 3 || rec.Turns[2].Reply != "c" {
		t.Fatalf("%+v %v", rec, err)
	}

	// A torn update: its bytes are there without the newline.
	w, _ := os.OpenFile(f.path("s"), os.O_WRONLY|os.O_APPEND, 0)
	w.WriteString(`{"id":"s","acp_session_id":"x","turns":[{"run_id":"`)
	w.Close()
	rec, size, err := f.read("s")
	if err != nil || len(rec.Turns) != 3 || size != -1 {
		t.Fatalf("torn journal: %+v size %d %v", rec, size, err)
	}
	if err := f.update("s", func(r *sessionRecord) { r.Asked = append(r.Asked, "ia1") }); err != nil {
		t.Fatal(err)
	}
	if l := lines("s"); len(l) != 1 || !f.asked("s", "ia1") {
		t.Fatalf("after the torn line, the journal is rewritten: %q", l)
	}

	// The whole-file format of earlier daemons.
	os.WriteFile(f.legacyPath("old"), []byte(`{"id":"old","acp_session_id":"acp-1","turns":[{"run_id":"r","prompt":"p","reply":"r","end":"end_turn"}]}`), 0o600)
	if got, err := f.load("old"); err != nil || got.ACPSessionID != "acp-1" || f.count() != 2 {
		t.Fatalf("legacy record: %+v %v, %d sessions", got, err, f.count())
	}
	if err := f.update("old", func(r *sessionRecord) { r.addTurn(turnRecord{Prompt: "q"}) }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.legacyPath("old")); !os.IsNotExist(err) || f.count() != 2 {
		t.Fatalf("the legacy file stays: %v, %d sessions", err, f.count())
	}
	if rec, _, _ := f.read("old"); len(rec.Turns) != 2 || rec.ACPSessionID != "acp-1" {
		t.Fatalf("moved record: %+v", rec)
	}

	// Compaction: a journal never grows past its bound.
	big := strings.Repeat("x", 8<<10)
	for range 40 {
		if err := f.update("big", func(r *sessionRecord) { r.addTurn(turnRecord{Prompt: big}) }); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := os.Stat(f.path("big"))
	rec, _, _ = f.read("big")
	if len(rec.Turns) != 40 || st.Size() > compactAt(int(st.Size())/len(lines("big"))) {
		t.Fatalf("journal of %d bytes in %d lines, %d turns", st.Size(), len(lines("big")), len(rec.Turns))
	}
}

// TestSessionJournalCreate: a session the daemon named is stored without
// a read (create), and its journal is then appended to like any other;
// an update reads the journal with the descriptor it appends through, so
// a record read and written in one open stays whole.
func TestSessionJournalCreate(t *testing.T) {
	f, err := newFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.create(&sessionRecord{ID: "n", ACPSessionID: "acp"}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := f.update("n", func(r *sessionRecord) { r.addTurn(turnRecord{Prompt: strings.Repeat("p", 9000)}) }); err != nil {
			t.Fatal(err)
		}
	}
	rec, size, err := f.read("n")
	b, _ := os.ReadFile(f.path("n"))
	if err != nil || rec.ACPSessionID != "acp" || len(rec.Turns) != 3 || size != int64(len(b)) || strings.Count(string(b), "\n") != 4 {
		t.Fatalf("%+v size %d of %d, %v", rec, size, len(b), err)
	}
}

// TestSessionJournalCreatePlanted: a file already where a named session's
// journal goes (a command planted it) is replaced, not appended to.
func TestSessionJournalCreatePlanted(t *testing.T) {
	f, err := newFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(f.path("n"), []byte(`{"id":"n","acp_session_id":"planted"}`+"\n"), 0o600)
	if err := f.create(&sessionRecord{ID: "n", ACPSessionID: "acp"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(f.path("n")); strings.Contains(string(b), "planted") {
		t.Fatalf("the planted journal stays: %q", b)
	}
}
