package httptool

import (
	"bytes"
	"encoding/json"
	"io"
	"net/url"
	"slices"
	"strings"
)

// Redactor replaces secret values, in every spelling an echo may give them
// (Spellings), by their placeholders. The http_request tool redacts whole
// responses with it; the gateway's model relay redacts streamed ones
// (Reader), where a value may arrive split across chunks.
type Redactor struct {
	// spellings, longest first, so that at one position a longer
	// spelling wins over a shorter one it begins with.
	spellings []spelling
}

type spelling struct{ form, placeholder []byte }

// Add makes r replace value (each of its spellings) by placeholder; an
// empty value is ignored.
func (r *Redactor) Add(value, placeholder string) {
	if value == "" {
		return
	}
	for _, f := range Spellings(value) {
		r.spellings = append(r.spellings, spelling{[]byte(f), []byte(placeholder)})
	}
	slices.SortStableFunc(r.spellings, func(a, b spelling) int { return len(b.form) - len(a.form) })
}

// Empty reports whether r redacts nothing.
func (r *Redactor) Empty() bool { return r == nil || len(r.spellings) == 0 }

// Longest is the length of the longest spelling.
func (r *Redactor) Longest() int {
	if r.Empty() {
		return 0
	}
	return len(r.spellings[0].form)
}

// Redact returns s with every spelling of a value replaced.
func (r *Redactor) Redact(s string) string {
	if r.Empty() || !r.any(s) {
		return s
	}
	out, _ := r.redact(nil, []byte(s), true)
	return string(out)
}

func (r *Redactor) any(s string) bool {
	for _, sp := range r.spellings {
		if strings.Contains(s, string(sp.form)) {
			return true
		}
	}
	return false
}

// ScrubTail removes the longest tail of s that is a proper prefix of a
// spelling: a value cut short (by truncation, or a stream that broke off)
// is not recognised by Redact.
func (r *Redactor) ScrubTail(s string) string {
	if r.Empty() {
		return s
	}
	return s[:len(s)-r.partial([]byte(s))]
}

// redact appends b to dst with every spelling replaced. Unless final, the
// tail of b that may be the start of a spelling completed by what follows
// is not appended but returned (a slice of b), to be redacted with it.
func (r *Redactor) redact(dst, b []byte, final bool) (out, held []byte) {
	for {
		i, sp := r.next(b)
		if sp == nil {
			break
		}
		dst = append(dst, b[:i]...)
		dst = append(dst, sp.placeholder...)
		b = b[i+len(sp.form):]
	}
	if final {
		return append(dst, b...), nil
	}
	k := len(b) - r.partial(b)
	return append(dst, b[:k]...), b[k:]
}

// next finds the earliest spelling in b (the longest at that position).
func (r *Redactor) next(b []byte) (int, *spelling) {
	at, found := -1, (*spelling)(nil)
	for i := range r.spellings {
		sp := &r.spellings[i]
		// Past the best match so far, only an earlier one matters.
		limit := len(b)
		if at >= 0 {
			limit = min(len(b), at+len(sp.form)-1)
		}
		if j := bytes.Index(b[:limit], sp.form); j >= 0 && (at < 0 || j < at) {
			at, found = j, sp
		}
	}
	return at, found
}

// partial is the length of the longest tail of b that is a proper prefix
// of a spelling.
func (r *Redactor) partial(b []byte) int {
	best := 0
	for _, sp := range r.spellings {
		f := sp.form
		// Only a tail shorter than f, and longer than the best so far.
		for i := max(0, len(b)-len(f)+1); i < len(b)-best; i++ {
			j := bytes.IndexByte(b[i:len(b)-best], f[0])
			if j < 0 {
				break
			}
			i += j
			if bytes.HasPrefix(f, b[i:]) {
				best = len(b) - i
				break
			}
		}
	}
	return best
}

// Reader returns src's bytes with every spelling replaced, as they come: a
// read returns as soon as what src gave is known not to begin a spelling,
// so a stream is not held back beyond the bytes that might. At src's end
// the bytes held are passed on (they were no value); when src fails, they
// are dropped, since a value cut short is not recognised.
func (r *Redactor) Reader(src io.Reader) io.Reader {
	if r.Empty() {
		return src
	}
	// 8 KiB: a model's stream (the reader's main use) comes in events of a
	// few hundred bytes, and the buffer is held for as long as the stream
	// is open (issue 41's memory per stream); a large body takes more
	// reads of it, at no measurable cost (BenchmarkModelRelayRedaction).
	return &redactReader{r: r, src: src, buf: make([]byte, 8<<10)}
}

type redactReader struct {
	r   *Redactor
	src io.Reader
	buf []byte
	// pending are bytes read but not decided; out[off:] are redacted
	// bytes not yet returned.
	pending, out []byte
	off          int
	err          error
}

func (rr *redactReader) Read(p []byte) (int, error) {
	for rr.off == len(rr.out) {
		if rr.err != nil {
			return 0, rr.err
		}
		n, err := rr.src.Read(rr.buf)
		in := rr.buf[:n]
		if len(rr.pending) > 0 {
			rr.pending = append(rr.pending, in...)
			in = rr.pending
		}
		rr.off = 0
		switch {
		case err == nil:
			var held []byte
			rr.out, held = rr.r.redact(rr.out[:0], in, false)
			rr.pending = append(rr.pending[:0], held...)
		case err == io.EOF:
			rr.out, _ = rr.r.redact(rr.out[:0], in, true)
			rr.pending, rr.err = nil, io.EOF
		default:
			rr.out, _ = rr.r.redact(rr.out[:0], in, false)
			rr.pending, rr.err = nil, err
		}
	}
	n := copy(p, rr.out[rr.off:])
	rr.off += n
	return n, nil
}

// Spellings are the forms a value takes: as is, then escaped for a query,
// a path, and a JSON (or Go-quoted) string with and without HTML escaping,
// so an echo in any of them is redacted. Longest first.
func Spellings(v string) []string {
	out := []string{v}
	j, _ := json.Marshal(v)
	var plain strings.Builder
	enc := json.NewEncoder(&plain)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	p := strings.TrimSpace(plain.String())
	for _, f := range []string{url.QueryEscape(v), url.PathEscape(v), string(j[1 : len(j)-1]), p[1 : len(p)-1]} {
		if f != v && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}
