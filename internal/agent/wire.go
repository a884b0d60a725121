package agent

import (
	"io"
	"sync"
	"unicode/utf8"

	acp "github.com/coder/acp-go-sdk"
)

// The hot notification, session/update with a text chunk, is encoded here
// instead of by acp-go-sdk. The SDK marshals an update three times (the
// variant, a map built from it, then the whole message, whose params it
// scans once more); that was a third of the agent's CPU per streamed event
// (docs/benchmarks.md, "Chat": "What got the chat path here"). The bytes are the SDK's own, byte for
// byte (TestTextUpdateMatchesSDK): the keys in the order it writes them,
// strings escaped as encoding/json escapes them (HTML characters, U+2028
// and U+2029 included, invalid UTF-8 as U+FFFD).

// lineWriter is the agent's output, shared by the SDK and the text fast
// path: each Write is one whole JSON-RPC message (the SDK writes a message
// in one call), and the lock keeps messages from interleaving.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// textUpdates encodes one turn's text chunks. The prefix (everything up to
// the text) depends on the session and the model only, so it is built once
// per model id.
type textUpdates struct {
	session acp.SessionId
	model   string // the model the prefix was built for
	prefix  []byte
	buf     []byte
}

const (
	updateHead       = `{"jsonrpc":"2.0","method":"session/update","params":{"_meta":{"cohort.dev/model":`
	updateTextTail   = `,"type":"text"},"sessionUpdate":"agent_message_chunk"}}}` + "\n"
	updateThoughTail = `,"type":"text"},"sessionUpdate":"agent_thought_chunk"}}}` + "\n"
)

// line returns the encoded notification; it is valid until the next call.
func (e *textUpdates) line(model, text string, thought bool) []byte {
	if e.prefix == nil || model != e.model {
		p := append(e.prefix[:0], updateHead...)
		p = appendJSONString(p, model, false)
		p = append(p, `},"sessionId":`...)
		p = appendJSONString(p, string(e.session), false)
		p = append(p, `,"update":{"content":{"text":`...)
		e.prefix, e.model = p, model
	}
	b := append(e.buf[:0], e.prefix...)
	b = appendJSONString(b, text, true)
	if thought {
		b = append(b, updateThoughTail...)
	} else {
		b = append(b, updateTextTail...)
	}
	e.buf = b
	return b
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string the way encoding/json's
// Marshal writes it (with its default HTML escaping). A byte that is not
// UTF-8 becomes "\ufffd", or with rawBad the character U+FFFD itself: the
// SDK passes an update's content through a map and back, and the second
// encoding writes the decoded replacement character as is.
func appendJSONString(b []byte, s string, rawBad bool) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				// Other control characters, and <, > and & (HTML escaping).
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			if rawBad {
				b = append(b, "\uFFFD"...)
			} else {
				b = append(b, `\ufffd`...)
			}
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
