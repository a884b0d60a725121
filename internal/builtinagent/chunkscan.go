package builtinagent

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// scan reads the chunks nearly every event of a stream is (a content or
// reasoning delta) without encoding/json, which was most of the agent's
// CPU per unmerged chunk even decoding into streamChunk (docs/benchmarks.md,
// "Chat path"). It validates what it skips, and gives up (false) on
// anything it does not read exactly as encoding/json would: tool calls,
// usage (other than null), error, a key spelled in another case or with escapes, a value of
// another type, a number other than a plain integer index. decode then
// reads the chunk with encoding/json; TestChunkScanAgrees and
// FuzzChunkScan hold the two to the same result.
func (c *streamChunk) scan(data []byte) bool {
	choices := c.Choices[:cap(c.Choices)]
	clear(choices)
	*c = streamChunk{Choices: choices[:0]}
	s := scanner{b: data}
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return s.end()
	}
	seenChoices := false
	for {
		k, ok := s.key()
		if !ok {
			return false
		}
		switch string(k) {
		case "model":
			if !s.stringInto(&c.Model) {
				return false
			}
		case "choices":
			if seenChoices || !s.choices(c) {
				return false
			}
			seenChoices = true
		case "usage":
			// OpenAI sends "usage": null on every chunk but the last.
			s.ws()
			if !bytes.HasPrefix(s.b[s.i:], []byte("null")) || !s.skip(0) {
				return false
			}
		default:
			if foldsTo(k, "model", "choices", "usage", "error") || !s.skip(0) {
				return false
			}
		}
		if s.next(',') {
			continue
		}
		return s.next('}') && s.end()
	}
}

func (s *scanner) choices(c *streamChunk) bool {
	if !s.next('[') {
		return false // null or another type: encoding/json's business
	}
	if s.next(']') {
		return true
	}
	for {
		if !s.next('{') {
			return false
		}
		c.Choices = append(c.Choices, chunkChoice{})
		ch := &c.Choices[len(c.Choices)-1]
		if !s.next('}') {
			if !s.choice(ch) {
				return false
			}
		}
		if s.next(',') {
			continue
		}
		return s.next(']')
	}
}

// choice reads a choice's members, after its '{', through its '}'.
func (s *scanner) choice(ch *chunkChoice) bool {
	for {
		k, ok := s.key()
		if !ok {
			return false
		}
		switch string(k) {
		case "index":
			if !s.integer(&ch.Index) {
				return false
			}
		case "finish_reason":
			if !s.stringInto(&ch.FinishReason) {
				return false
			}
		case "delta":
			if !s.next('{') {
				return false
			}
			if !s.next('}') && !s.delta(&ch.Delta) {
				return false
			}
		default:
			if foldsTo(k, "index", "finish_reason", "delta") || !s.skip(0) {
				return false
			}
		}
		if s.next(',') {
			continue
		}
		return s.next('}')
	}
}

// delta reads a delta's members, after its '{', through its '}'.
func (s *scanner) delta(d *chunkDelta) bool {
	for {
		k, ok := s.key()
		if !ok {
			return false
		}
		switch string(k) {
		case "content":
			if !s.stringInto(&d.Content) {
				return false
			}
		case "reasoning", "reasoning_content":
			s.ws()
			start := s.i
			if !s.skip(0) {
				return false
			}
			raw := json.RawMessage(bytes.Clone(s.b[start:s.i]))
			if string(k) == "reasoning" {
				d.Reasoning = raw
			} else {
				d.ReasoningContent = raw
			}
		default:
			if foldsTo(k, "content", "reasoning", "reasoning_content", "tool_calls") || !s.skip(0) {
				return false
			}
		}
		if s.next(',') {
			continue
		}
		return s.next('}')
	}
}

// foldsTo reports whether k is, or matches in another case, one of the
// keys: encoding/json would then decode it into that field.
func foldsTo(k []byte, keys ...string) bool {
	for _, key := range keys {
		if bytes.EqualFold(k, []byte(key)) {
			return true
		}
	}
	return false
}

// scanner reads JSON from b at i.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next consumes c (after whitespace) if it comes next.
func (s *scanner) next(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether only whitespace is left.
func (s *scanner) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// key reads a member's key and its colon; a key with escapes is not read.
func (s *scanner) key() ([]byte, bool) {
	tok, plain, ok := s.str()
	if !ok || !plain || !s.next(':') {
		return nil, false
	}
	return tok[1 : len(tok)-1], true
}

// str reads a string token, quotes included; plain when it has no escapes.
func (s *scanner) str() (tok []byte, plain, ok bool) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false, false
	}
	plain = true
	for i := s.i + 1; i < len(s.b); i++ {
		switch c := s.b[i]; {
		case c == '"':
			tok, s.i = s.b[s.i:i+1], i+1
			return tok, plain, true
		case c == '\\':
			plain = false
			if i+1 >= len(s.b) {
				return nil, false, false
			}
			switch s.b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if i+5 >= len(s.b) {
					return nil, false, false
				}
				for _, h := range s.b[i+2 : i+6] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return nil, false, false
					}
				}
				i += 5
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		}
	}
	return nil, false, false
}

// stringInto reads a string, or null (which leaves *v as it is, as
// encoding/json does).
func (s *scanner) stringInto(v *string) bool {
	s.ws()
	if bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		return s.skip(0)
	}
	tok, plain, ok := s.str()
	if !ok {
		return false
	}
	if plain && utf8.Valid(tok) {
		*v = string(tok[1 : len(tok)-1])
		return true
	}
	// Escapes and bytes that are not UTF-8: encoding/json's own reading.
	return json.Unmarshal(tok, v) == nil
}

// integer reads a plain integer (no fraction or exponent) that fits.
func (s *scanner) integer(v *int64) bool {
	s.ws()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	digits := s.i
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		s.i++
	}
	n := s.i - digits
	if n == 0 || n > 18 || (n > 1 && s.b[digits] == '0') {
		return false
	}
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return false
	}
	var x int64
	for _, c := range s.b[digits:s.i] {
		x = x*10 + int64(c-'0')
	}
	if s.b[start] == '-' {
		x = -x
	}
	*v = x
	return true
}

// skip reads and validates any value.
func (s *scanner) skip(depth int) bool {
	if depth > 64 {
		return false
	}
	s.ws()
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; c {
	case '"':
		_, _, ok := s.str()
		return ok
	case '{':
		s.i++
		if s.next('}') {
			return true
		}
		for {
			if _, _, ok := s.str(); !ok || !s.next(':') || !s.skip(depth+1) {
				return false
			}
			if s.next(',') {
				continue
			}
			return s.next('}')
		}
	case '[':
		s.i++
		if s.next(']') {
			return true
		}
		for {
			if !s.skip(depth + 1) {
				return false
			}
			if s.next(',') {
				continue
			}
			return s.next(']')
		}
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		return s.number()
	}
}

func (s *scanner) literal(l string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(l)) {
		return false
	}
	s.i += len(l)
	return true
}

// number reads a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() bool {
	digits := func() int {
		n := 0
		for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case digits() == 0:
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}
