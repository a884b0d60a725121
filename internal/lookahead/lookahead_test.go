package lookahead

import (
	"io"
	"testing"
)

// arrivals is a body whose reads return what "arrived" in each step, as a
// network body returns what is there, and count how often they are asked.
type arrivals struct {
	steps [][]byte
	reads int
}

func (a *arrivals) Read(p []byte) (int, error) {
	a.reads++
	if len(a.steps) == 0 {
		return 0, io.EOF
	}
	n := copy(p, a.steps[0])
	if a.steps[0] = a.steps[0][n:]; len(a.steps[0]) == 0 {
		a.steps = a.steps[1:]
	}
	return n, nil
}

func (a *arrivals) Close() error { return nil }

func TestLookahead(t *testing.T) {
	body := &arrivals{steps: [][]byte{[]byte("HEAD1body1HEAD2body2"), []byte("HEAD3body3")}}
	l := &Body{body: body}
	r := reader{l}
	read := func(n int) string {
		t.Helper()
		p := make([]byte, n)
		if _, err := io.ReadFull(r, p); err != nil {
			t.Fatal(err)
		}
		return string(p)
	}
	// The first read may wait: it goes into the caller's buffer, and
	// nothing is buffered (an idle stream holds no buffer).
	if got := read(5); got != "HEAD1" || l.Buffered() != nil || l.buf != nil {
		t.Fatalf("first read %q, buffered %q", got, l.Buffered())
	}
	// The next one takes everything that has arrived with it.
	if got := read(5); got != "body1" || string(l.Buffered()) != "HEAD2body2" {
		t.Fatalf("second read %q, buffered %q", got, l.Buffered())
	}
	if got := read(10); got != "HEAD2body2" || l.Buffered() != nil || l.buf != nil {
		t.Fatalf("third read %q, buffered %q, buffer held %v", got, l.Buffered(), l.buf != nil)
	}
	if body.reads != 2 {
		t.Errorf("%d reads of the body for the first arrival, want 2", body.reads)
	}
	// Drained: the next read may wait again, so it is direct.
	if got := read(5); got != "HEAD3" || l.Buffered() != nil {
		t.Fatalf("read after draining %q, buffered %q", got, l.Buffered())
	}
	if got := read(5); got != "body3" {
		t.Fatalf("last read %q", got)
	}
	if n, err := r.Read(make([]byte, 5)); n != 0 || err != io.EOF {
		t.Fatalf("at the end: %d, %v", n, err)
	}
}
