package builtinagent

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"

	acp "github.com/coder/acp-go-sdk"
)

// sdkWire encodes notifications with acp-go-sdk itself, as the agent did
// before it encoded text chunks on its own.
type sdkWire struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	conn *acp.AgentSideConnection
	in   *io.PipeWriter
}

func newSDKWire(t testing.TB) *sdkWire {
	w := &sdkWire{}
	r, in := io.Pipe()
	w.in = in
	w.conn = acp.NewAgentSideConnection(New(Config{}), w, r)
	t.Cleanup(func() { in.Close() })
	return w
}

func (w *sdkWire) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *sdkWire) encode(t testing.TB, session, model, text string, thought bool) string {
	w.mu.Lock()
	w.buf.Reset()
	w.mu.Unlock()
	u := acp.UpdateAgentMessageText(text)
	if thought {
		u = acp.UpdateAgentThoughtText(text)
	}
	err := w.conn.SessionUpdate(context.Background(), acp.SessionNotification{SessionId: acp.SessionId(session), Update: u, Meta: map[string]any{MetaModel: model}})
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

var wireSamples = []string{
	"", "hello", "word42 ", `quote " and backslash \ and slash /`, "<b>&amp;</b>", "line\nbreak\r\ttab\b\f",
	"\x00\x01\x1f\x7f", "héllo wörld", "日本語", "emoji 🎉👍🏽", "\u2028 and \u2029", "bad \xff byte", "\xc3", "\xed\xa0\x80 surrogate",
	"\ufffd literal", strings.Repeat("x", 5000), "<script>alert('x')</script>",
}

// TestTextUpdateMatchesSDK: the agent's own encoding of a text chunk is the
// SDK's, byte for byte.
func TestTextUpdateMatchesSDK(t *testing.T) {
	w := newSDKWire(t)
	var e textUpdates
	e.session = "sess_0123456789abcdef"
	for _, model := range []string{"bench/model", "m<&>\u2028", "bad\xffmodel", ""} {
		for _, text := range wireSamples {
			for _, thought := range []bool{false, true} {
				want := w.encode(t, string(e.session), model, text, thought)
				if got := string(e.line(model, text, thought)); got != want {
					t.Errorf("model %q text %q thought %v:\n got %s\nwant %s", model, text, thought, got, want)
				}
			}
		}
	}
}

func FuzzTextUpdate(f *testing.F) {
	for _, s := range wireSamples {
		f.Add(s, "m")
	}
	w := newSDKWire(f)
	f.Fuzz(func(t *testing.T, text, model string) {
		e := textUpdates{session: "sess_1"}
		for _, thought := range []bool{false, true} {
			if got, want := string(e.line(model, text, thought)), w.encode(t, "sess_1", model, text, thought); got != want {
				t.Fatalf("text %q model %q:\n got %s\nwant %s", text, model, got, want)
			}
		}
	})
}

// BenchmarkTextUpdateEncode: one agent_message_chunk notification encoded
// by acp-go-sdk (as the agent did before, and as the intern daemon's
// sdk-agent test agent still does) and by textUpdates.
func BenchmarkTextUpdateEncode(b *testing.B) {
	const text = "token 000042 "
	b.Run("acp-go-sdk", func(b *testing.B) {
		w := newSDKWire(b)
		b.ReportAllocs()
		for range b.N {
			w.encode(b, "sess_0123456789abcdef", "bench/model", text, false)
		}
	})
	b.Run("textUpdates", func(b *testing.B) {
		e := textUpdates{session: "sess_0123456789abcdef"}
		b.ReportAllocs()
		for range b.N {
			if len(e.line("bench/model", text, false)) == 0 {
				b.Fatal("empty")
			}
		}
	})
}
