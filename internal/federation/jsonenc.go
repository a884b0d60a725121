package federation

import (
	"strconv"
	"unicode/utf8"
)

// The exchange writes two small JSON documents per call, the access
// token's claims and the response body, with fixed shapes. Appending them
// by hand costs a fraction of encoding/json's reflection
// (docs/benchmarks.md); the bytes are exactly what json.Marshal writes for
// the same values (signing_internal_test.go compares them).

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string the way encoding/json does
// by default: ", \ and control characters escaped, <, > and & escaped for
// HTML, U+2028 and U+2029 escaped, invalid UTF-8 replaced by U+FFFD.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	done := 0 // s[:done] is already in dst
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, s[done:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, `\b`...)
			case '\f':
				dst = append(dst, `\f`...)
			case '\n':
				dst = append(dst, `\n`...)
			case '\r':
				dst = append(dst, `\r`...)
			case '\t':
				dst = append(dst, `\t`...)
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			done = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[done:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[done:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		done = i
	}
	dst = append(dst, s[done:]...)
	return append(dst, '"')
}

// appendJSONMember appends `"name":` and the string value, preceded by a
// comma unless it is the object's first member (dst ends with '{').
func appendJSONMember(dst []byte, name, value string) []byte {
	dst = appendJSONName(dst, name)
	return appendJSONString(dst, value)
}

func appendJSONName(dst []byte, name string) []byte {
	if len(dst) > 0 && dst[len(dst)-1] != '{' {
		dst = append(dst, ',')
	}
	dst = appendJSONString(dst, name)
	return append(dst, ':')
}

func appendJSONInt(dst []byte, name string, v int64) []byte {
	dst = appendJSONName(dst, name)
	return strconv.AppendInt(dst, v, 10)
}
