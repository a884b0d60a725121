package builtinagent

import (
	"io"
	"sync"
	"unicode/utf8"

	acp "github.com/coder/acp-go-sdk"

	"github.com/cohort-dev/cohort/internal/jsonstr"
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

// appendJSONString appends s as a JSON string the way encoding/json's
// Marshal writes it (with its default HTML escaping). A byte that is not
// UTF-8 becomes "\ufffd", or with rawBad the character U+FFFD itself: the
// SDK passes an update's content through a map and back, and the second
// encoding writes the decoded replacement character as is.
func appendJSONString(b []byte, s string, rawBad bool) []byte {
	if rawBad && !utf8.ValidString(s) {
		s = replaceBadBytes(s)
	}
	return jsonstr.Append(b, s, true)
}

// replaceBadBytes replaces each byte of s that is not UTF-8 with U+FFFD,
// one per byte as encoding/json does (strings.ToValidUTF8 replaces a run
// with one).
func replaceBadBytes(s string) string {
	out := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, s[i:i+size]...)
		}
		i += size
	}
	return string(out)
}
