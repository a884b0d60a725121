package acptap

import (
	"encoding/json"
	"strings"
	"testing"
)

// sdkShape writes a text chunk as acp-go-sdk does (keys in its order).
func sdkShape(session, model, text string, thought, meta bool) string {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	kind := "agent_message_chunk"
	if thought {
		kind = "agent_thought_chunk"
	}
	m := ""
	if meta {
		m = `"_meta":{"cohort.dev/model":` + q(model) + `},`
	}
	return `{"jsonrpc":"2.0","method":"session/update","params":{` + m + `"sessionId":` + q(session) +
		`,"update":{"content":{"text":` + q(text) + `,"type":"text"},"sessionUpdate":"` + kind + `"}}}` + "\n"
}

// general is what the general path decodes from a line.
func general(t testing.TB, line string) (Update, bool) {
	var u wireUpdate
	if json.Unmarshal([]byte(line), &u) != nil {
		return Update{}, false
	}
	up := u.Params.Update
	model := u.Params.Meta.Model
	if model == "" {
		model = up.Meta.Model
	}
	return Update{SessionID: u.Params.SessionID, Text: up.Content.Text, Model: model, Thought: up.SessionUpdate == "agent_thought_chunk"}, true
}

var fastSamples = []string{"", "x", "word42 ", `q " b \ s /`, "<b>&</b>", "a\nb\tc", "\x01", "héllo 日本 🎉", "\u2028", "bad \xff", "\ufffd", strings.Repeat("y", 3000)}

// TestFastTakeAgreesWithGeneral: the fixed-shape reader gives what the
// general decoding gives, or leaves the line to it.
func TestFastTakeAgreesWithGeneral(t *testing.T) {
	n := 0
	for _, text := range fastSamples {
		for _, model := range []string{"m", "a/b<c>", "bad\xffm"} {
			for _, thought := range []bool{false, true} {
				for _, meta := range []bool{false, true} {
					line := sdkShape("sess_1", model, text, thought, meta)
					for _, l := range []string{line, strings.ReplaceAll(line, `\u003c`, "<"), strings.TrimSuffix(line, "\n") + "\r\n"} {
						want, wok := general(t, l)
						got, ok := fastTake([]byte(l))
						if ok {
							n++
						}
						if ok && (!wok || got != want) {
							t.Errorf("%q: fast %+v, general %+v (%v)", l, got, want, wok)
						}
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("the fast path took no line")
	}
	// Other shapes are left to the general path.
	for _, l := range []string{
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hel"}}}}`,
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"content":{"text":"a","type":"text"},"sessionUpdate":"agent_message_chunk"}}} x`,
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"content":{"text":"a` + "\x01" + `","type":"text"},"sessionUpdate":"agent_message_chunk"}}}`,
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"content":{"text":"a","type":"text"},"sessionUpdate":"plan"}}}`,
	} {
		if u, ok := fastTake([]byte(l)); ok {
			t.Errorf("%q taken as %+v", l, u)
		}
	}
}

func FuzzFastTake(f *testing.F) {
	for _, s := range fastSamples {
		f.Add(sdkShape("s", "m", s, false, true))
	}
	f.Fuzz(func(t *testing.T, line string) {
		got, ok := fastTake([]byte(line))
		if !ok {
			return
		}
		if want, wok := general(t, line); !wok || got != want {
			t.Fatalf("%q: fast %+v, general %+v (%v)", line, got, want, wok)
		}
	})
}
