package builtinagent

import (
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

func TestEventReader(t *testing.T) {
	long := strings.Repeat("z", 200<<10)
	body := ": comment\r\n\r\n" +
		"event: x\ndata: {\"a\":1}\n\n" +
		"data:two\r\ndata: lines\r\n\r\n" +
		"id: 3\nretry: 10\n\n" + // no data: no event
		"data: " + long + "\n\n" +
		"data: unfinished" // no empty line: dropped, as the SDK does
	e := newEventReader(strings.NewReader(body), nil)
	var got []string
	for {
		d, ok := e.next()
		if !ok {
			break
		}
		got = append(got, string(d))
	}
	want := []string{"{\"a\":1}\n", "two\nlines\n", long + "\n"}
	if e.err != nil || len(got) != len(want) {
		t.Fatalf("events %d (%v), want %d", len(got), e.err, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d: %.80q, want %.80q", i, got[i], want[i])
		}
	}
}

func TestChunkDecode(t *testing.T) {
	var c streamChunk
	if err := c.decode([]byte(`{"model":"m","choices":[{"index":0,"delta":{"content":"a","reasoning":"r","tool_calls":[{"index":0,"id":"c1","function":{"name":"shell","arguments":"{"}}]},"finish_reason":null}]}`)); err != nil {
		t.Fatal(err)
	}
	if c.Model != "m" || len(c.Choices) != 1 || c.Choices[0].Delta.Content != "a" || c.Choices[0].Delta.reasoning() != "r" ||
		len(c.Choices[0].Delta.ToolCalls) != 1 || c.Usage != nil {
		t.Fatalf("%+v", c)
	}
	// Nothing of the last chunk stays; a reasoning object is not text; a
	// field of another type is left empty.
	if err := c.decode([]byte(`{"choices":[{"index":0,"delta":{"reasoning":{"x":1},"reasoning_content":"rc"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":"x","total_tokens":5,"cost":null}}`)); err != nil {
		t.Fatal(err)
	}
	d := c.Choices[0].Delta
	if c.Model != "" || d.Content != "" || d.reasoning() != "rc" || len(d.ToolCalls) != 0 || c.Choices[0].FinishReason != "stop" {
		t.Fatalf("%+v", c)
	}
	u := c.Usage.read()
	if u.PromptTokens != 3 || u.CompletionTokens != 0 || u.TotalTokens != 5 || u.CachedTokens != nil || u.Cost == nil || *u.Cost != 0 {
		t.Fatalf("usage %+v", u)
	}
	// Any top-level "error", even null, is a stream error, as in the SDK.
	for data, msg := range map[string]string{
		`{"error":null}`:                  "received error while streaming: ",
		`{"error":"boom"}`:                "received error while streaming: boom",
		`{"error":{"message":"x","c":1}}`: `received error while streaming: {"message":"x","c":1}`,
	} {
		var se *ssestream.StreamError
		if err := c.decode([]byte(data)); !errors.As(err, &se) || se.Message != msg {
			t.Errorf("%s: %v, want %q", data, err, msg)
		}
	}
	if err := c.decode([]byte(`{"choices":[`)); err == nil {
		t.Error("malformed chunk accepted")
	}
}

// TestDeltasMergeOnlyWhatIsBuffered: deltas that arrive together go out as
// one, and a delta goes out before the reader waits for more.
func TestDeltasMergeOnlyWhatIsBuffered(t *testing.T) {
	pr, pw := io.Pipe()
	sent := make(chan Delta, 16)
	out := mergedDeltas{emit: func(d Delta) error { sent <- d; return nil }}
	e := newEventReader(pr, out.flush)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var c streamChunk
		for {
			data, ok := e.next()
			if !ok {
				break
			}
			if err := c.decode(data); err != nil {
				t.Error(err)
			}
			for _, ch := range c.Choices {
				if ch.Delta.Content != "" {
					out.add(c.Model, ch.Delta.Content, false)
				}
				if r := ch.Delta.reasoning(); r != "" {
					out.add(c.Model, r, true)
				}
			}
		}
		out.flush()
	}()
	ev := func(model, field, s string) string {
		return `data: {"model":"` + model + `","choices":[{"index":0,"delta":{"` + field + `":"` + s + `"}}]}` + "\n\n"
	}
	// Three at once: one text delta, sent before the reader waits for more.
	io.WriteString(pw, ev("m", "content", "a")+ev("m", "content", "b")+ev("m", "content", "c"))
	select {
	case d := <-sent:
		if d != (Delta{Model: "m", Text: "abc"}) {
			t.Fatalf("first delta %+v", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the buffered deltas were not sent while the reader waited")
	}
	// Another kind, another model: never merged.
	io.WriteString(pw, ev("m", "content", "d")+ev("m", "reasoning", "r")+ev("m2", "reasoning", "s")+ev("m2", "reasoning", "t"))
	pw.Close()
	<-done
	close(sent)
	want := []Delta{{Model: "m", Text: "d"}, {Model: "m", Reasoning: "r"}, {Model: "m2", Reasoning: "st"}}
	var got []Delta
	for d := range sent {
		got = append(got, d)
	}
	if len(got) != len(want) {
		t.Fatalf("sent %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("delta %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// BenchmarkChunkDecode: one typical content chunk decoded by openai-go
// (as the agent did before), by encoding/json into streamChunk (decode's
// fallback) and by decode (its scan).
func BenchmarkChunkDecode(b *testing.B) {
	data := []byte(`{"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1,"model":"bench/model","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":"token 000042 "},"logprobs":null,"finish_reason":null}]}` + "\n")
	b.Run("openai-go", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			var c openai.ChatCompletionChunk
			if err := json.Unmarshal(data, &c); err != nil || c.Choices[0].Delta.Content == "" {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) { // decode's fallback
		b.ReportAllocs()
		for range b.N {
			if c, err := slowDecode(data); err != nil || c.Choices[0].Delta.Content == "" {
				b.Fatal(err)
			}
		}
	})
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		var c streamChunk
		for range b.N {
			if err := c.decode(data); err != nil || c.Choices[0].Delta.Content == "" {
				b.Fatal(err)
			}
		}
	})
}

var chunkSamples = []string{
	`{"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1,"model":"bench/model","choices":[{"index":0,"delta":{"content":"token 000042 "},"finish_reason":null}]}`,
	`{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt","system_fingerprint":"fp","service_tier":"default","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"x"}`,
	`{"model":"m","choices":[{"index":0,"delta":{"reasoning":"think \"hard\" \u00e9\n"},"finish_reason":null}]}`,
	`{"model":"m","choices":[{"index":0,"delta":{"reasoning_content":{"a":[1,2.5e3,true,false,null]},"content":null}}]}`,
	`{"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
	`{"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`,
	`{"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"shell","arguments":"{}"}}]}}]}`,
	`{"error":{"message":"x"}}`, `{"Model":"m"}`, "{\"model\":\"a\xffb\",\"choices\":[{\"index\":1,\"delta\":{\"content\":\"<&>\\u2028 \xe2\x80\xa8\"}}]}",
	`{"model":"m","choices":[{"index":0.0}]}`, `{"model":"m","choices":[{"index":-0,"finish_reason":7}]}`, `{"model":1}`,
	`{"model":"m","choices":null}`, `{"model":"m","choices":[null]}`, `{"model":"m"} x`, `{"model":"m",}`, `{"model":"m"`, `[]`, ``,
	`{"a":01}`, `{"a":"\x"}`, `{"a":tru}`, `{"a":[1,]}`, `{"mod\u0065l":"m"}`, `{"model":"m","model":"n"}`,
	` {"model" : "m" , "choices" : [ { "index" : 0 , "delta" : { "content" : "x" } } ] } ` + "\n",
}

// slowDecode is the encoding/json reading decode falls back to.
func slowDecode(data []byte) (streamChunk, error) {
	var c streamChunk
	err := json.Unmarshal(data, &c)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		err = nil
	}
	return c, err
}

// TestChunkScanAgrees: what scan reads, encoding/json reads the same.
func TestChunkScanAgrees(t *testing.T) {
	taken := 0
	for _, data := range chunkSamples {
		var c streamChunk
		if !c.scan([]byte(data)) {
			continue
		}
		taken++
		want, err := slowDecode([]byte(data))
		if err != nil || !reflect.DeepEqual(normalized(c), normalized(want)) {
			t.Errorf("%s:\n scan %+v\n json %+v (%v)", data, c, want, err)
		}
	}
	if taken < 8 {
		t.Errorf("scan read only %d of the samples", taken)
	}
}

// normalized makes empty and nil slices alike.
func normalized(c streamChunk) streamChunk {
	if len(c.Choices) == 0 {
		c.Choices = nil
	}
	return c
}

func FuzzChunkScan(f *testing.F) {
	for _, s := range chunkSamples {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		var c streamChunk
		if !c.scan([]byte(data)) {
			return
		}
		want, err := slowDecode([]byte(data))
		if err != nil || !reflect.DeepEqual(normalized(c), normalized(want)) {
			t.Fatalf("%q:\n scan %+v\n json %+v (%v)", data, c, want, err)
		}
	})
}
