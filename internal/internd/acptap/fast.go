package acptap

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// The text chunks of acp-go-sdk agents (the built-in agent among them)
// come in one fixed shape: the SDK writes keys in one order. Lines in that
// shape are read here without encoding/json, which was most of the tap's
// CPU (docs/benchmarks.md, "Chat": "What got the chat path here"); any other line, or a string this
// reader does not take as is, goes to the general decoding, so the result
// is the same.

const (
	fastHead    = `{"jsonrpc":"2.0","method":"session/update","params":{`
	fastMeta    = `"_meta":{"cohort.dev/model":`
	fastSession = `"sessionId":`
	fastText    = `,"update":{"content":{"text":`
	fastKind    = `,"type":"text"},"sessionUpdate":"`
	fastMessage = `agent_message_chunk"}}}`
	fastThought = `agent_thought_chunk"}}}`
)

// fastTake decodes a text chunk in the SDK's shape; ok is false for any
// other line.
func fastTake(line []byte) (u Update, ok bool) {
	rest, ok := bytes.CutPrefix(line, []byte(fastHead))
	if !ok {
		return u, false
	}
	if r, ok := bytes.CutPrefix(rest, []byte(fastMeta)); ok {
		if u.Model, rest, ok = fastString(r); !ok {
			return u, false
		}
		if rest, ok = bytes.CutPrefix(rest, []byte("},")); !ok {
			return u, false
		}
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(fastSession)); !ok {
		return u, false
	}
	if u.SessionID, rest, ok = fastString(rest); !ok {
		return u, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(fastText)); !ok {
		return u, false
	}
	if u.Text, rest, ok = fastString(rest); !ok {
		return u, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(fastKind)); !ok {
		return u, false
	}
	switch {
	case bytes.HasPrefix(rest, []byte(fastMessage)):
		rest = rest[len(fastMessage):]
	case bytes.HasPrefix(rest, []byte(fastThought)):
		rest, u.Thought = rest[len(fastThought):], true
	default:
		return u, false
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return u, false
	}
	return u, true
}

// fastString reads the JSON string at the start of b and returns its
// value and what follows it. A string with escapes or bytes that are not
// UTF-8 is decoded by encoding/json, whose result (U+FFFD for bad bytes)
// the general path would give; one with a raw control character is not
// JSON, and is left to the general path.
func fastString(b []byte) (string, []byte, bool) {
	if len(b) == 0 || b[0] != '"' {
		return "", nil, false
	}
	plain := true
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			tok := b[:i+1]
			if plain && utf8.Valid(tok) {
				return string(tok[1:i]), b[i+1:], true
			}
			var s string
			if json.Unmarshal(tok, &s) != nil {
				return "", nil, false
			}
			return s, b[i+1:], true
		case c == '\\':
			plain = false
			i++ // the escaped byte cannot end the string
		case c < 0x20:
			return "", nil, false
		}
	}
	return "", nil, false
}
