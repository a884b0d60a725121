package builtinagent

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/shared"
)

// The request body the agent encodes is the one openai-go would encode from
// its params (as the agent sent before), with "stream": true.
func TestRequestBodyMatchesOpenAIParams(t *testing.T) {
	req := ModelRequest{
		Model: "m-1",
		Messages: []Message{
			{Role: "system", Content: "sys"},
			{Role: "user", Content: "hi \"there\" <b>"},
			{Role: "user", Content: ""},
			{Role: "assistant", Content: "let me", ToolCalls: []ToolCall{{ID: "c1", Name: "shell", Arguments: `{"command":"ls"}`}, {ID: "c2", Name: "http_request", Arguments: `{}`}}},
			{Role: "tool", Content: `{"output":"x"}`, ToolCallID: "c1"},
			{Role: "tool", Content: "", ToolCallID: "c2"},
			{Role: "assistant", ToolCalls: []ToolCall{{ID: "c3", Name: "ask_user", Arguments: ""}}},
			{Role: "assistant", Content: "done"},
			{Role: "assistant"},
		},
		Tools: append(append([]ToolSpec(nil), tools...), ToolSpec{Name: "empty", Parameters: map[string]any{"type": "object"}}),
	}
	params := openai.ChatCompletionNewParams{
		Model:         shared.ChatModel(req.Model),
		Messages:      toOpenAIMessages(req.Messages),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: param.NewOpt(true)},
	}
	for _, t := range req.Tools {
		params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name:        t.Name,
			Description: param.NewOpt(t.Description),
			Parameters:  shared.FunctionParameters(t.Parameters),
		}))
	}
	theirs, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	ours, err := requestBody(req)
	if err != nil {
		t.Fatal(err)
	}
	var a, b map[string]any
	if err := json.Unmarshal(theirs, &a); err != nil {
		t.Fatal(err)
	}
	a["stream"] = true // openai-go's NewStreaming sets it
	if err := json.Unmarshal(ours, &b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("bodies differ:\nopenai-go %s\nagent     %s", theirs, ours)
	}
}

// toOpenAIMessages is how the agent built openai-go's params before it
// encoded the body itself.
func toOpenAIMessages(msgs []Message) []openai.ChatCompletionMessageParamUnion {
	out := make([]openai.ChatCompletionMessageParamUnion, 0, len(msgs))
	for _, m := range msgs {
		switch m.Role {
		case "system":
			out = append(out, openai.SystemMessage(m.Content))
		case "user":
			out = append(out, openai.UserMessage(m.Content))
		case "tool":
			out = append(out, openai.ToolMessage(m.Content, m.ToolCallID))
		case "assistant":
			a := openai.ChatCompletionAssistantMessageParam{}
			if m.Content != "" {
				a.Content.OfString = param.NewOpt(m.Content)
			}
			for _, tc := range m.ToolCalls {
				a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
					OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
						ID:       tc.ID,
						Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: tc.Name, Arguments: tc.Arguments},
					},
				})
			}
			out = append(out, openai.ChatCompletionMessageParamUnion{OfAssistant: &a})
		}
	}
	return out
}
