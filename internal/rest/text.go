package rest

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/cohort-dev/cohort/internal/apierr"
)

// CheckText refuses a JSON body that holds text which is not Unicode:
// bytes that are not UTF-8, or a \u escape of a lone surrogate. encoding/json
// would quietly store either as U+FFFD; the caller is told which field
// instead (400 bad_request).
func CheckText(body []byte) error {
	off := badText(body)
	if off < 0 {
		return nil
	}
	return apierr.BadRequest("%s is not valid UTF-8 text (byte %d)", fieldAt(body, off), off)
}

// badText is the offset of the first invalid byte or lone surrogate escape
// inside a string, or -1.
func badText(b []byte) int {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			if c == '\\' && i+1 < len(b) && b[i+1] == 'u' {
				if r, ok := hex4(b, i+2); ok && r >= 0xD800 && r <= 0xDFFF {
					// A high surrogate must be followed by \u and a low one.
					if r >= 0xDC00 {
						return i
					}
					if lo, ok := hex4(b, i+8); !ok || i+7 >= len(b) || b[i+6] != '\\' || b[i+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
						return i
					}
					i += 12
					continue
				}
				i += 2
				continue
			}
			if c == '\\' {
				i += 2 // an escaped character (\\ included) is never a \u start
				continue
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return -1
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	return rune(n), err == nil
}

// fieldAt names the JSON member that holds byte off ("the body" when no
// member does), as a path: messages[1].content.
func fieldAt(body []byte, off int) string {
	type level struct {
		array bool
		key   string
		index int
	}
	var stack []level
	path := func() string {
		var sb strings.Builder
		for _, l := range stack {
			switch {
			case l.array:
				sb.WriteString("[" + strconv.Itoa(l.index) + "]")
			case l.key != "":
				if sb.Len() > 0 {
					sb.WriteByte('.')
				}
				sb.WriteString(l.key)
			}
		}
		if sb.Len() == 0 {
			return "the body"
		}
		return sb.String()
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	expectKey := false
	for {
		before := int(dec.InputOffset())
		tok, err := dec.Token()
		if err != nil {
			return path()
		}
		end := tok == json.Delim('}') || tok == json.Delim(']')
		if n := len(stack); n > 0 && stack[n-1].array && !end {
			stack[n-1].index++
		}
		if n := len(stack); n > 0 && !stack[n-1].array && expectKey {
			if k, ok := tok.(string); ok {
				stack[n-1].key, expectKey = k, false
				if before <= off && off < int(dec.InputOffset()) {
					return path()
				}
				continue
			}
		}
		if before <= off && off < int(dec.InputOffset()) {
			return path()
		}
		switch tok {
		case json.Delim('{'):
			stack, expectKey = append(stack, level{}), true
			continue
		case json.Delim('['):
			stack, expectKey = append(stack, level{array: true, index: -1}), false
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: an object's next token is a key.
		expectKey = len(stack) > 0 && !stack[len(stack)-1].array
	}
}
