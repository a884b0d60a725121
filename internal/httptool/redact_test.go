package httptool

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// chunks yields its parts one read at a time, then err.
type chunks struct {
	parts []string
	err   error
}

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.parts) == 0 {
		return 0, c.err
	}
	n := copy(p, c.parts[0])
	c.parts[0] = c.parts[0][n:]
	if c.parts[0] == "" {
		c.parts = c.parts[1:]
	}
	return n, nil
}

// A value is redacted wherever a stream splits it, in each of its
// spellings, and what cannot begin a value is passed on at once.
func TestRedactorReaderSplitAnywhere(t *testing.T) {
	const value = `sk-a/b"c`
	r := &Redactor{}
	r.Add(value, "{{secret:k}}")
	doc := `{"echo":"` + strings.ReplaceAll(value, `"`, `\"`) + `","q":"sk-a%2Fb%22c","raw":"` + value + `"} s`
	want := `{"echo":"{{secret:k}}","q":"{{secret:k}}","raw":"{{secret:k}}"} s`
	for i := 0; i <= len(doc); i++ {
		for j := i; j <= len(doc); j++ {
			got, err := io.ReadAll(r.Reader(&chunks{parts: []string{doc[:i], doc[i:j], doc[j:]}, err: io.EOF}))
			if err != nil || string(got) != want {
				t.Fatalf("split at %d,%d: %q %v", i, j, got, err)
			}
		}
	}
	// One byte at a time too.
	if got, _ := io.ReadAll(r.Reader(iotest.OneByteReader(strings.NewReader(doc)))); string(got) != want {
		t.Fatalf("byte by byte: %q", got)
	}
	// A chunk that cannot begin the value is returned whole, before the
	// next one is read.
	rd := r.Reader(&chunks{parts: []string{"data: one\n\n", "data: two\n\n"}, err: io.EOF})
	buf := make([]byte, 100)
	if n, err := rd.Read(buf); err != nil || string(buf[:n]) != "data: one\n\n" {
		t.Fatalf("first read %q %v", buf[:n], err)
	}
	// A chunk ending with the value's start holds exactly that start back.
	rd = r.Reader(&chunks{parts: []string{"x sk-a", "/b\"c y"}, err: io.EOF})
	if n, _ := rd.Read(buf); string(buf[:n]) != "x " {
		t.Fatalf("held back wrongly: %q", buf[:n])
	}
}

// When the stream breaks off, a held start of a value is dropped; at its
// end, a start that was no value is passed on.
func TestRedactorReaderEnds(t *testing.T) {
	r := &Redactor{}
	r.Add("sk-secret", "PH")
	broke := errors.New("broke")
	got, err := io.ReadAll(r.Reader(&chunks{parts: []string{"a sk-sec"}, err: broke}))
	if !errors.Is(err, broke) || string(got) != "a " {
		t.Fatalf("broken stream: %q %v", got, err)
	}
	got, err = io.ReadAll(r.Reader(&chunks{parts: []string{"a sk-s", "ec"}, err: io.EOF}))
	if err != nil || string(got) != "a sk-sec" {
		t.Fatalf("ended stream: %q %v", got, err)
	}
	if r.Redact("sk-secretsk-secret") != "PHPH" || !bytes.Equal([]byte(r.ScrubTail("x sk-se")), []byte("x ")) {
		t.Fatal("Redact or ScrubTail")
	}
}
