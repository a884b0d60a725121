package builtinagent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/openai/openai-go/v3/packages/ssestream"
)

// The chat-completions event stream, read without openai-go's generic
// decoding. The SDK decodes every chunk into its full ChatCompletionChunk
// (a validation pass, a gjson pass for "error", then reflection that keeps
// the raw text of every field); the agent needs a dozen fields. The rules
// are the SDK's (ssestream): events end at an empty line, `data:` lines
// join with newlines, "[DONE]" ends the stream, and any top-level "error"
// key, even null, is a stream error (StreamError, same message).

// maxEventLine bounds one line of the stream, as the SDK's scanner does.
const maxEventLine = bufio.MaxScanTokenSize << 9

// eventReader reads the data of server-sent events.
type eventReader struct {
	br *bufio.Reader
	// beforeWait runs before a read that may wait for the network: nothing
	// complete is buffered. An error from it ends the stream (hookErr).
	beforeWait func() error
	data       []byte
	long       []byte
	err        error // the body's error (io.EOF is not one)
	hookErr    error
}

// eventReaderSize is the read buffer of one model stream, live for the
// whole stream: 16 KiB holds about 90 common chunks, enough for the
// merged updates of at most 4 KiB; 64 KiB was most of the agent's heap per
// open stream and streamed no faster (ADR 0995).
const eventReaderSize = 16 << 10

func newEventReader(r io.Reader, beforeWait func() error) *eventReader {
	return &eventReader{br: bufio.NewReaderSize(r, eventReaderSize), beforeWait: beforeWait}
}

// next returns the next event's data, valid until the next call; false at
// the end of the body, with err set if it did not end cleanly.
func (e *eventReader) next() ([]byte, bool) {
	e.data = e.data[:0]
	for {
		line, ok := e.line()
		if !ok {
			// As the SDK: an event not closed by an empty line is dropped.
			return nil, false
		}
		if len(line) == 0 {
			if len(e.data) == 0 {
				continue
			}
			return e.data, true
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		if string(name) == "data" {
			e.data = append(e.data, value...)
			e.data = append(e.data, '\n')
		}
		// Comments (": …"), event names, ids and retry hints: nothing the
		// chat completion needs.
	}
}

// line returns the next line without its end (\n or \r\n), as
// bufio.ScanLines splits them.
func (e *eventReader) line() ([]byte, bool) {
	if e.err != nil || e.hookErr != nil {
		return nil, false
	}
	e.long = e.long[:0]
	for {
		if e.beforeWait != nil && bytes.IndexByte(peekBuffered(e.br), '\n') < 0 {
			if err := e.beforeWait(); err != nil {
				e.hookErr = err
				return nil, false
			}
		}
		frag, err := e.br.ReadSlice('\n')
		line := frag
		if len(e.long) > 0 || err == bufio.ErrBufferFull {
			e.long = append(e.long, frag...)
			line = e.long
		}
		switch {
		case err == bufio.ErrBufferFull:
			if len(e.long) > maxEventLine {
				e.err = bufio.ErrTooLong
				return nil, false
			}
			continue
		case err == io.EOF:
			if len(line) == 0 {
				return nil, false
			}
			// A last line without its newline still counts.
			e.err = nil
		case err != nil:
			e.err = err
			return nil, false
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		return bytes.TrimSuffix(line, []byte("\r")), true
	}
}

func peekBuffered(br *bufio.Reader) []byte {
	b, _ := br.Peek(br.Buffered())
	return b
}

// streamChunk is the part of a chat.completion.chunk the agent uses.
type streamChunk struct {
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *chunkUsage   `json:"usage"`
	// Error is set (even to null) when the key is present.
	Error json.RawMessage `json:"error"`
}

type chunkChoice struct {
	Index        int64      `json:"index"`
	FinishReason string     `json:"finish_reason"`
	Delta        chunkDelta `json:"delta"`
}

type chunkDelta struct {
	Content string `json:"content"`
	// Reasoning text sits in non-standard fields: `reasoning` (OpenRouter,
	// vLLM) or `reasoning_content` (DeepSeek, llama.cpp); kept raw, as
	// some servers put objects there.
	Reasoning        json.RawMessage `json:"reasoning"`
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	ToolCalls        []chunkToolCall `json:"tool_calls"`
}

type chunkToolCall struct {
	Index    int64  `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chunkUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	TotalTokens         int64 `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	// Cost (USD) is OpenRouter's usage.cost.
	Cost json.RawMessage `json:"cost"`
}

// decode reads one event's data into c (reusing its slices). A field of an
// unexpected type is left empty, as the SDK's lenient decoding leaves it
// invalid; malformed JSON is an error.
func (c *streamChunk) decode(data []byte) error {
	if c.scan(data) { // the common chunks, without encoding/json
		return nil
	}
	// encoding/json decodes into the elements a slice already has without
	// zeroing them: clear them, or a field missing from this chunk would
	// keep the last chunk's value.
	choices := c.Choices[:cap(c.Choices)]
	clear(choices)
	*c = streamChunk{Choices: choices[:0]}
	err := json.Unmarshal(data, c)
	var te *json.UnmarshalTypeError
	if err != nil && !errors.As(err, &te) {
		return err
	}
	if c.Error != nil {
		return &ssestream.StreamError{Message: fmt.Sprintf("received error while streaming: %s", errorText(c.Error)),
			Event: ssestream.Event{Data: bytes.Clone(data)}}
	}
	return nil
}

// errorText is how the SDK (gjson's String) shows an "error" value: a
// string unquoted, null as nothing, anything else as written.
func errorText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	var s string
	switch {
	case string(raw) == "null":
		return ""
	case len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil:
		return s
	}
	return string(raw)
}

func (d *chunkDelta) reasoning() string {
	for _, raw := range []json.RawMessage{d.Reasoning, d.ReasoningContent} {
		if len(raw) == 0 || raw[0] != '"' {
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) == nil && s != "" {
			return s
		}
	}
	return ""
}

func (u *chunkUsage) read() *CallUsage {
	out := &CallUsage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	if u.PromptTokensDetails != nil && u.PromptTokensDetails.CachedTokens != nil {
		c := *u.PromptTokensDetails.CachedTokens
		out.CachedTokens = &c
	}
	if len(u.Cost) > 0 {
		var c float64
		if json.Unmarshal(u.Cost, &c) == nil {
			out.Cost = &c
		}
	}
	return out
}

// maxMergedText bounds the text of one merged update: 4 KiB, the intern
// daemon's own bound on a merged delta, so its run events stay below the
// size at which it would gzip them.
const maxMergedText = 4 << 10

// mergedDeltas joins consecutive deltas of one kind (text or reasoning)
// and one model into one Delta, sent by flush.
type mergedDeltas struct {
	emit    func(Delta) error
	model   string
	thought bool
	text    []byte
}

func (m *mergedDeltas) add(model, s string, thought bool) error {
	if len(m.text) > 0 && (model != m.model || thought != m.thought || len(m.text)+len(s) > maxMergedText) {
		if err := m.flush(); err != nil {
			return err
		}
	}
	m.model, m.thought = model, thought
	m.text = append(m.text, s...)
	return nil
}

func (m *mergedDeltas) flush() error {
	if len(m.text) == 0 {
		return nil
	}
	d := Delta{Model: m.model}
	if m.thought {
		d.Reasoning = string(m.text)
	} else {
		d.Text = string(m.text)
	}
	m.text = m.text[:0]
	return m.emit(d)
}
