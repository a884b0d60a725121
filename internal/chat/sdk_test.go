package chat_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// sdkStream runs one streaming request through the official OpenAI Go SDK
// pointed at the intern (base URL …/interns/{id}/, to which the SDK adds
// "chat/completions") and accumulates it the way SDK users do.
func sdkStream(t *testing.T, e *env, msgs []openai.ChatCompletionMessageParamUnion, opts ...option.RequestOption) (openai.ChatCompletionAccumulator, string, error) {
	t.Helper()
	client := openai.NewClient(
		option.WithBaseURL(e.URL+"/interns/"+e.InternID),
		option.WithAPIKey(e.WorkspaceKey),
		option.WithHTTPClient(e.HTTPClient()),
		option.WithMaxRetries(0),
	)
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model: "ignored/model", Messages: msgs,
	}, opts...)
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	session := ""
	for stream.Next() {
		c := stream.Current()
		if !acc.AddChunk(c) {
			t.Fatalf("the accumulator refused chunk %s", c.RawJSON())
		}
		if f, ok := c.JSON.ExtraFields["session_id"]; ok && f.Raw() != "null" {
			session = strings.Trim(f.Raw(), `"`)
		}
	}
	return acc, session, stream.Err()
}

func TestOpenAISDK(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))

	t.Run("text and usage", func(t *testing.T) {
		sc := events(nil, started("sess-1"), reasoningEv(model, "hm"), textEv(model, "Hello"), textEv(model, ", world."),
			usageEv(model, &interndv1.Usage{PromptTokens: 21, CompletionTokens: 7, TotalTokens: 28, CachedTokens: ptr[int64](4)}), stopEv(model))
		e.d.set(sc, sc)
		acc, session, err := sdkStream(t, e, []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello")})
		if err != nil {
			t.Fatal(err)
		}
		if got := acc.Choices[0].Message.Content; got != "Hello, world." {
			t.Errorf("content %q", got)
		}
		if acc.Choices[0].FinishReason != "stop" || acc.ID != "chatcmpl-test" || acc.Model != model {
			t.Errorf("finish %q id %q model %q", acc.Choices[0].FinishReason, acc.ID, acc.Model)
		}
		if acc.Usage.PromptTokens != 21 || acc.Usage.CompletionTokens != 7 || acc.Usage.TotalTokens != 28 || acc.Usage.PromptTokensDetails.CachedTokens != 4 {
			t.Errorf("usage %+v (summed more than once?)", acc.Usage)
		}
		if session != "sess-1" {
			t.Errorf("session %q", session)
		}
	})

	t.Run("pause, then answer and continue", func(t *testing.T) {
		pause := events(nil, started("sess-1"), textEv(model, "May I?"), permissionEv(model, "int-1", ptr("shell")),
			finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED}))
		cont := events(nil, continuation("sess-1"), textEv(model, "file1"), usageEv(model, &interndv1.Usage{TotalTokens: 5, PromptTokens: 3, CompletionTokens: 2}), stopEv(model))
		e.d.set(pause, cont)
		history := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("$ ls")}
		acc, session, err := sdkStream(t, e, history, option.WithJSONSet("approval_mode", "manual"))
		if err != nil {
			t.Fatal(err)
		}
		msg := acc.Choices[0].Message
		if acc.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) != 1 {
			t.Fatalf("finish %q, %d tool calls", acc.Choices[0].FinishReason, len(msg.ToolCalls))
		}
		tc := msg.ToolCalls[0]
		if tc.ID != "int-1" || tc.Function.Name != "service.provide_input" ||
			tc.Function.Arguments != `{"kind":"permission","operation":"shell","options":["allow_once","allow_always","reject_once","reject_always"]}` {
			t.Errorf("tool call %+v", tc)
		}
		if acc.Usage.TotalTokens != 0 {
			t.Errorf("usage after tool_calls %+v", acc.Usage)
		}
		if session != "sess-1" {
			t.Fatalf("session %q", session)
		}
		// The SDK user echoes the assistant message and answers the call.
		history = append(history, msg.ToParam(), openai.ToolMessage("allow_once", tc.ID))
		acc, _, err = sdkStream(t, e, history, option.WithJSONSet("session_id", session))
		if err != nil {
			t.Fatal(err)
		}
		if acc.Choices[0].Message.Content != "file1" || acc.Usage.TotalTokens != 5 {
			t.Errorf("continuation %q usage %+v", acc.Choices[0].Message.Content, acc.Usage)
		}
		_, answers := e.d.calls()
		last := answers[len(answers)-1]
		if last.GetSessionId() != "sess-1" || last.GetInteractionId() != "int-1" || last.GetAnswer() != "allow_once" {
			t.Errorf("answer %v", last)
		}
	})

	t.Run("error chunk is a stream error", func(t *testing.T) {
		sc := events(nil, started("sess-1"), textEv(model, "partial"),
			finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_ERROR, Code: 502, ErrorReason: "turn_failed", Message: "provider failed"}))
		e.d.set(sc, sc)
		acc, _, err := sdkStream(t, e, []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")})
		var se *ssestream.StreamError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "turn_failed") {
			t.Fatalf("err = %v", err)
		}
		if acc.Choices[0].Message.Content != "partial" {
			t.Errorf("content before the error %q", acc.Choices[0].Message.Content)
		}
	})

	t.Run("refusal before the stream", func(t *testing.T) {
		sc := events(refuse(409, "busy"))
		e.d.set(sc, sc)
		_, _, err := sdkStream(t, e, []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")})
		var ae *openai.Error
		if !errors.As(err, &ae) || ae.StatusCode != 409 || !strings.Contains(ae.RawJSON(), `"reason":"busy"`) {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestOpenAISDKListsModels: the SDK's models.list with the intern as its
// base URL answers the intern's model, as clients that list models first
// need (it was 404 no route); another workspace's key and no key are
// refused as the chat refuses them.
func TestOpenAISDKListsModels(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))
	var in store.Intern
	if err := e.DB.NewSelect().Model(&in).Where("id = ?", e.InternID).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	client := openai.NewClient(option.WithBaseURL(e.URL+"/interns/"+e.InternID), option.WithAPIKey(e.WorkspaceKey),
		option.WithHTTPClient(e.HTTPClient()), option.WithMaxRetries(0))
	page, err := client.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != in.Model || page.Data[0].Object != "model" || page.Data[0].OwnedBy != "cohort" {
		t.Fatalf("models: %+v", page.Data)
	}
	for key, want := range map[string]int{"": 401, "cohort_wk_notakey": 401} {
		status, body, _ := e.Do(t, "GET", "/interns/"+e.InternID+"/models", key, "", "")
		if status != want {
			t.Errorf("key %q: %d %s", key, status, body)
		}
	}
	status, body, _ := e.Do(t, "GET", "/interns/no-such-intern/models", e.WorkspaceKey, "", "")
	wantRefusal(t, status, body, 404, "not_found")
}
