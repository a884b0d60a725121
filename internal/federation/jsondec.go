package federation

import (
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// decodeObject decodes one JSON object (RFC 8259) into the map
// json.Unmarshal gives for a map[string]any, refusing duplicate member
// names at its top level (nested objects keep the last, as json does).
// Numbers become float64, which NumericDate claims are; strings, bools,
// null, []any and map[string]any are as json makes them.
//
// It is the subject token's claims decoder, on every exchange: json's
// reflection and its separate validity pass cost about as much as the
// rest of the exchange's own work (docs/benchmarks.md). Its errors are the
// ones the exchange reported with json.Unmarshal: "not JSON" for a syntax
// error, "not a JSON object" for another JSON value or a number out of
// float64 range, then "not UTF-8", then duplicate names
// (jsondec_test.go compares the two on fuzzed input).
func decodeObject(b []byte) (map[string]any, error) {
	d := jsonDecoder{s: string(b)} // one copy: unescaped strings are substrings of it
	d.space()
	if d.i == len(d.s) {
		return nil, errNotJSON
	}
	if d.s[d.i] != '{' {
		// Any other value is refused as json would, after the syntax.
		if !d.skipValue() || !d.end() {
			return nil, errNotJSON
		}
		return nil, errNotObject
	}
	d.depth = 1
	m, dup := d.object(true)
	if d.err != nil || !d.end() {
		return nil, errNotJSON
	}
	if d.rangeErr {
		return nil, errNotObject
	}
	if !utf8.ValidString(d.s) {
		return nil, errors.New("not UTF-8")
	}
	if dup {
		return nil, errors.New("a member name appears twice")
	}
	return m, nil
}

var (
	errNotJSON   = errors.New("not JSON")
	errNotObject = errors.New("not a JSON object")
	errSyntax    = errors.New("syntax")
)

type jsonDecoder struct {
	s        string
	i        int
	depth    int
	err      error
	rangeErr bool // a number does not fit a float64
}

// maxJSONDepth is json's nesting limit, past which it reports a syntax
// error. (A subject token is too short to reach it.)
const maxJSONDepth = 10000

func (d *jsonDecoder) space() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// end reports whether only white space is left.
func (d *jsonDecoder) end() bool {
	d.space()
	return d.i == len(d.s)
}

func (d *jsonDecoder) fail() { d.err = errSyntax }

// value decodes the value at d.i.
func (d *jsonDecoder) value() any {
	d.space()
	if d.i >= len(d.s) {
		d.fail()
		return nil
	}
	switch c := d.s[d.i]; {
	case c == '{' || c == '[':
		if d.depth++; d.depth > maxJSONDepth {
			d.fail()
			return nil
		}
		defer func() { d.depth-- }()
		if c == '[' {
			return d.array()
		}
		m, _ := d.object(false)
		return m
	case c == '"':
		return d.str()
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	case d.literal("true"):
		return true
	case d.literal("false"):
		return false
	case d.literal("null"):
		return nil
	}
	d.fail()
	return nil
}

func (d *jsonDecoder) literal(lit string) bool {
	if len(d.s)-d.i >= len(lit) && d.s[d.i:d.i+len(lit)] == lit {
		d.i += len(lit)
		return true
	}
	return false
}

// object decodes the object at d.i ('{'); dup reports whether a name came
// twice.
func (d *jsonDecoder) object(top bool) (m map[string]any, dup bool) {
	d.i++ // {
	m = make(map[string]any, 8)
	d.space()
	if d.i < len(d.s) && d.s[d.i] == '}' {
		d.i++
		return m, false
	}
	for d.err == nil {
		d.space()
		if d.i >= len(d.s) || d.s[d.i] != '"' {
			d.fail()
			return nil, false
		}
		name := d.str()
		d.space()
		if d.err != nil || d.i >= len(d.s) || d.s[d.i] != ':' {
			d.fail()
			return nil, false
		}
		d.i++
		v := d.value()
		if d.err != nil {
			return nil, false
		}
		if _, seen := m[name]; seen && top {
			dup = true
		}
		m[name] = v
		d.space()
		if d.i >= len(d.s) {
			d.fail()
			return nil, false
		}
		switch d.s[d.i] {
		case ',':
			d.i++
		case '}':
			d.i++
			return m, dup
		default:
			d.fail()
			return nil, false
		}
	}
	return nil, false
}

func (d *jsonDecoder) array() []any {
	d.i++ // [
	out := make([]any, 0, 4)
	d.space()
	if d.i < len(d.s) && d.s[d.i] == ']' {
		d.i++
		return out
	}
	for d.err == nil {
		v := d.value()
		if d.err != nil {
			return nil
		}
		out = append(out, v)
		d.space()
		if d.i >= len(d.s) {
			d.fail()
			return nil
		}
		switch d.s[d.i] {
		case ',':
			d.i++
		case ']':
			d.i++
			return out
		default:
			d.fail()
			return nil
		}
	}
	return nil
}

// str decodes the string at d.i ('"'). Bytes of 0x80 and above are taken
// as they are (the caller refuses invalid UTF-8 afterwards); control
// characters must be escaped.
func (d *jsonDecoder) str() string {
	d.i++ // "
	start := d.i
	for d.i < len(d.s) {
		switch c := d.s[d.i]; {
		case c == '"':
			d.i++
			return d.s[start : d.i-1]
		case c == '\\':
			return d.escapedStr(start)
		case c < 0x20:
			d.fail()
			return ""
		default:
			d.i++
		}
	}
	d.fail()
	return ""
}

// escapedStr finishes a string with escapes, started at start; d.i is at
// the first backslash. A \u escape of half a surrogate pair that is not
// followed by its other half becomes U+FFFD, as in json.
func (d *jsonDecoder) escapedStr(start int) string {
	out := make([]byte, 0, d.i-start+16)
	out = append(out, d.s[start:d.i]...)
	for d.i < len(d.s) {
		c := d.s[d.i]
		switch {
		case c == '"':
			d.i++
			return string(out)
		case c < 0x20:
			d.fail()
			return ""
		case c != '\\':
			out = append(out, c)
			d.i++
			continue
		}
		if d.i+1 >= len(d.s) {
			break
		}
		e := d.s[d.i+1]
		d.i += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := d.hex4(d.i)
			if r < 0 {
				d.fail()
				return ""
			}
			d.i += 4
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if d.i+1 < len(d.s) && d.s[d.i] == '\\' && d.s[d.i+1] == 'u' {
					r2 = d.hex4(d.i + 2)
				}
				if pair := utf16.DecodeRune(r, r2); pair != utf8.RuneError {
					d.i += 6
					r = pair
				} else {
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			d.fail()
			return ""
		}
	}
	d.fail()
	return ""
}

// hex4 reads the four hex digits at i, or returns -1.
func (d *jsonDecoder) hex4(i int) rune {
	if len(d.s)-i < 4 {
		return -1
	}
	var r rune
	for _, c := range []byte(d.s[i : i+4]) {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// number decodes the number at d.i (RFC 8259's grammar) as a float64.
func (d *jsonDecoder) number() any {
	start := d.i
	if d.s[d.i] == '-' {
		d.i++
	}
	switch {
	case d.i < len(d.s) && d.s[d.i] == '0':
		d.i++
	case d.digits() == 0:
		d.fail()
		return nil
	}
	if d.i < len(d.s) && d.s[d.i] == '.' {
		d.i++
		if d.digits() == 0 {
			d.fail()
			return nil
		}
	}
	if d.i < len(d.s) && (d.s[d.i] == 'e' || d.s[d.i] == 'E') {
		d.i++
		if d.i < len(d.s) && (d.s[d.i] == '+' || d.s[d.i] == '-') {
			d.i++
		}
		if d.digits() == 0 {
			d.fail()
			return nil
		}
	}
	f, err := strconv.ParseFloat(d.s[start:d.i], 64)
	if err != nil {
		d.rangeErr = true
	}
	return f
}

func (d *jsonDecoder) digits() int {
	n := 0
	for d.i < len(d.s) && d.s[d.i] >= '0' && d.s[d.i] <= '9' {
		d.i++
		n++
	}
	return n
}

// skipValue steps over one value, reporting whether it is well formed.
func (d *jsonDecoder) skipValue() bool {
	d.value()
	return d.err == nil
}
