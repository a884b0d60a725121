package e2e_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
)

// sdk streams one request with the official OpenAI Go SDK pointed at the
// intern (base URL …/api/v1/interns/{id}) and accumulates it as SDK users do.
func sdk(t *testing.T, gw *proc, key, intern string, msgs []openai.ChatCompletionMessageParamUnion, opts ...option.RequestOption) (openai.ChatCompletionAccumulator, string, error) {
	t.Helper()
	client := openai.NewClient(option.WithBaseURL(gw.URL+"/api/v1/interns/"+intern), option.WithAPIKey(key), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 3*wait)
	defer cancel()
	st := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "any/model", Messages: msgs}, opts...)
	defer st.Close()
	var acc openai.ChatCompletionAccumulator
	session := ""
	for st.Next() {
		c := st.Current()
		if !acc.AddChunk(c) {
			t.Fatalf("the accumulator refused chunk %s", c.RawJSON())
		}
		if f, ok := c.JSON.ExtraFields["session_id"]; ok && f.Raw() != "null" {
			session = strings.Trim(f.Raw(), `"`)
		}
	}
	return acc, session, st.Err()
}

// The official SDK reads the real stack's streams: text and usage, the
// service.provide_input call with its arguments, the continuation after an
// answer, and an error chunk as a stream error.
func TestOpenAISDKEndToEnd(t *testing.T) {
	c, gw := newCluster(t, "")
	d := c.Daemon(t, c.NewIntern(t, "sdk"), nil)

	acc, session, err := sdk(t, gw, c.WK, d.id, []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello sdk")})
	if err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].Message.Content != "Hello from cohort/demo. You said: hello sdk" || acc.Choices[0].FinishReason != "stop" || acc.Model != "cohort/demo" {
		t.Fatalf("text %q finish %q model %q", acc.Choices[0].Message.Content, acc.Choices[0].FinishReason, acc.Model)
	}
	if acc.Usage.TotalTokens == 0 || acc.Usage.TotalTokens != acc.Usage.PromptTokens+acc.Usage.CompletionTokens || session == "" {
		t.Fatalf("usage %+v session %q", acc.Usage, session)
	}

	history := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("$ echo via-sdk")}
	acc, session, err = sdk(t, gw, c.WK, d.id, history, option.WithJSONSet("approval_mode", "manual"))
	if err != nil {
		t.Fatal(err)
	}
	msg := acc.Choices[0].Message
	if acc.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) != 1 || acc.Usage.TotalTokens != 0 || session == "" {
		t.Fatalf("pause: finish %q calls %d usage %+v session %q", acc.Choices[0].FinishReason, len(msg.ToolCalls), acc.Usage, session)
	}
	tc := msg.ToolCalls[0]
	if tc.Function.Name != "service.provide_input" ||
		tc.Function.Arguments != `{"kind":"permission","operation":"shell","options":["allow_once","allow_always","reject_once","reject_always"],"title":"shell","input":"echo via-sdk"}` {
		t.Fatalf("tool call %+v", tc)
	}
	history = append(history, msg.ToParam(), openai.ToolMessage("allow_once", tc.ID))
	acc, _, err = sdk(t, gw, c.WK, d.id, history, option.WithJSONSet("session_id", session))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(acc.Choices[0].Message.Content, "via-sdk") || acc.Usage.TotalTokens == 0 {
		t.Fatalf("continuation %q usage %+v", acc.Choices[0].Message.Content, acc.Usage)
	}

	up := agenttest.NewUpstream(t, agenttest.Step{Chunks: []string{agenttest.Text(upModel, "half")}, CloseMidStream: true})
	f := c.Daemon(t, c.NewIntern(t, "sdk-fail"), upstreamEnv(up), "--model", upModel)
	acc, _, err = sdk(t, gw, c.WK, f.id, []openai.ChatCompletionMessageParamUnion{openai.UserMessage("fail")})
	var se *ssestream.StreamError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "turn_failed") || acc.Choices[0].Message.Content != "half" {
		t.Fatalf("err %v content %q", err, acc.Choices[0].Message.Content)
	}
}
