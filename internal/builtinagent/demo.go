package builtinagent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// DemoModelID is the offline model's id.
const DemoModelID = "cohort/demo"

// DemoModel is the offline, deterministic model `cohort/demo`. It needs no
// network and decides from the conversation alone; see the package
// documentation for what it does.
type DemoModel struct{}

// Complete implements Model.
func (DemoModel) Complete(ctx context.Context, req ModelRequest, emit func(Delta) error) (ModelResponse, error) {
	if len(req.Messages) == 0 {
		return ModelResponse{}, &UpstreamError{Reason: "turn_failed", Message: "cohort/demo: empty conversation"}
	}
	last := req.Messages[len(req.Messages)-1]
	var reasoning, text []string
	var calls []ToolCall
	callID := fmt.Sprintf("demo_call_%d", len(req.Messages))
	switch last.Role {
	case "tool":
		reasoning, text = demoAfterTool(req.Messages, last)
	default:
		prompt := strings.TrimSpace(last.Content)
		switch {
		case strings.HasPrefix(last.Content, "$ ") && strings.TrimSpace(last.Content[2:]) != "":
			cmd := strings.TrimSpace(last.Content[2:])
			reasoning = []string{"The prompt starts with \"$ \", ", "so the rest is a shell command ", "to run with the shell tool."}
			args, _ := json.Marshal(map[string]string{"command": cmd})
			calls = []ToolCall{{ID: callID, Name: ToolShell, Arguments: string(args)}}
		case strings.HasSuffix(prompt, "?"):
			reasoning = []string{"The prompt ends with a question mark, ", "so I ask the user ", "before I answer."}
			args, _ := json.Marshal(map[string]any{
				"message": "Before I answer \"" + prompt + "\": what answer do you expect?",
				"fields":  []map[string]any{{"name": "answer", "type": "string", "required": true}},
			})
			calls = []ToolCall{{ID: callID, Name: ToolAskUser, Arguments: string(args)}}
		default:
			reasoning = []string{"The user said something; ", "I repeat it back ", "so they can check the round trip."}
			text = []string{"Hello from cohort/demo. ", "You said: ", prompt}
		}
	}
	resp := ModelResponse{Model: DemoModelID, ToolCalls: calls}
	for _, r := range reasoning {
		if err := demoEmit(ctx, emit, Delta{Model: DemoModelID, Reasoning: r}); err != nil {
			return resp, err
		}
	}
	var b strings.Builder
	for _, t := range text {
		b.WriteString(t)
		if err := demoEmit(ctx, emit, Delta{Model: DemoModelID, Text: t}); err != nil {
			return resp, err
		}
	}
	resp.Text = b.String()
	// Tokens are counted as words: plausible, deterministic, free.
	prompt := int64(0)
	for _, m := range req.Messages {
		prompt += words(m.Content)
		for _, c := range m.ToolCalls {
			prompt += words(c.Arguments)
		}
	}
	completion := words(strings.Join(reasoning, "")) + words(resp.Text)
	for _, c := range calls {
		completion += words(c.Arguments)
	}
	resp.Usage = &CallUsage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	return resp, nil
}

func demoEmit(ctx context.Context, emit func(Delta) error, d Delta) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return emit(d)
}

// demoAfterTool answers with what the tool reported.
func demoAfterTool(msgs []Message, last Message) (reasoning, text []string) {
	name := ""
	for _, m := range msgs {
		for _, c := range m.ToolCalls {
			if c.ID == last.ToolCallID {
				name = c.Name
			}
		}
	}
	switch name {
	case ToolShell:
		return []string{"The shell tool reported back; ", "I pass its result on."},
			[]string{"Shell result:\n", last.Content}
	case ToolAskUser:
		var r struct {
			Action  string         `json:"action"`
			Content map[string]any `json:"content"`
			Error   string         `json:"error"`
		}
		_ = json.Unmarshal([]byte(last.Content), &r)
		reasoning = []string{"The user replied to my question; ", "I use their reply."}
		switch r.Action {
		case "accept":
			answer, _ := json.Marshal(r.Content["answer"])
			if s, ok := r.Content["answer"].(string); ok {
				answer = []byte(s)
			}
			return reasoning, []string{"Thanks. ", "You answered: ", string(answer)}
		case "decline":
			return reasoning, []string{"You declined to answer, ", "so I will not guess."}
		case "cancel":
			return reasoning, []string{"You dismissed the question; ", "I stop here."}
		}
		return reasoning, []string{"The question could not be asked: ", last.Content}
	}
	return []string{"A tool reported back."}, []string{"Tool result: ", last.Content}
}

func words(s string) int64 { return int64(len(strings.Fields(s))) }
