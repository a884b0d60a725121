package sse

import (
	"math"
	"strconv"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/jsonstr"
)

// AppendChunk appends c as the spec's chunk JSON, keys in a fixed order.
//
// It is written by hand rather than with encoding/json because presence is
// part of the contract: `error` appears only on the terminal error chunk
// (openai-go treats any top-level `error` key, even null, as a failure),
// `session_id` and `usage` only on the final chunk (the one with empty
// choices), where both are explicit nulls when unset; `finish_reason` is
// always present, null while streaming.
func AppendChunk(b []byte, c *cohortv1.ChatCompletionChunk) []byte {
	b = append(b, `{"id":`...)
	b = appendString(b, c.GetId())
	b = append(b, `,"object":`...)
	b = appendString(b, c.GetObject())
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, c.GetCreated(), 10)
	b = append(b, `,"model":`...)
	b = appendString(b, c.GetModel())
	b = append(b, `,"choices":[`...)
	for i, ch := range c.GetChoices() {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendChoice(b, ch)
	}
	b = append(b, ']')
	if e := c.GetError(); e != nil {
		b = append(b, `,"error":{"code":`...)
		b = strconv.AppendInt(b, int64(e.GetCode()), 10)
		b = append(b, `,"message":`...)
		b = appendString(b, e.GetMessage())
		b = append(b, `,"metadata":{"reason":`...)
		b = appendString(b, e.GetReason())
		b = append(b, `}}`...)
	}
	if len(c.GetChoices()) == 0 {
		b = append(b, `,"session_id":`...)
		if c.SessionId != nil {
			b = appendString(b, c.GetSessionId())
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"usage":`...)
		b = appendUsage(b, c.GetUsage())
	}
	return append(b, '}')
}

func appendChoice(b []byte, ch *cohortv1.ChatChoice) []byte {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(ch.GetIndex()), 10)
	b = append(b, `,"delta":{`...)
	d := ch.GetDelta()
	n := 0
	field := func(name string) {
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":`...)
	}
	if d.Role != nil {
		field("role")
		b = appendString(b, d.GetRole())
	}
	if d.Content != nil {
		field("content")
		b = appendString(b, d.GetContent())
	}
	if d.Reasoning != nil {
		field("reasoning")
		b = appendString(b, d.GetReasoning())
	}
	if len(d.GetToolCalls()) > 0 {
		field("tool_calls")
		b = append(b, '[')
		for i, tc := range d.GetToolCalls() {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"index":`...)
			b = strconv.AppendInt(b, int64(tc.GetIndex()), 10)
			b = append(b, `,"id":`...)
			b = appendString(b, tc.GetId())
			b = append(b, `,"type":`...)
			b = appendString(b, tc.GetType())
			b = append(b, `,"function":{"name":`...)
			b = appendString(b, tc.GetFunction().GetName())
			b = append(b, `,"arguments":`...)
			b = appendString(b, tc.GetFunction().GetArguments())
			b = append(b, `}}`...)
		}
		b = append(b, ']')
	}
	b = append(b, `},"finish_reason":`...)
	if ch.FinishReason != nil {
		b = appendString(b, ch.GetFinishReason())
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}')
}

func appendUsage(b []byte, u *cohortv1.ChatUsage) []byte {
	if u == nil {
		return append(b, "null"...)
	}
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, u.GetPromptTokens(), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, u.GetCompletionTokens(), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, u.GetTotalTokens(), 10)
	// JSON has no NaN or infinity: a cost that is not a finite number is
	// left out rather than breaking every client's parser.
	if u.Cost != nil && !math.IsNaN(u.GetCost()) && !math.IsInf(u.GetCost(), 0) {
		b = append(b, `,"cost":`...)
		b = strconv.AppendFloat(b, u.GetCost(), 'g', -1, 64)
	}
	if u.CachedTokens != nil {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, u.GetCachedTokens(), 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendString appends s as a JSON string, as json.Marshal writes it
// without HTML escaping (as OpenAI's own streams do). U+2028 and U+2029
// are escaped and a raw newline can never appear, which keeps each event
// on one `data:` line.
func appendString(b []byte, s string) []byte { return jsonstr.Append(b, s, false) }
