package chat_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/chat"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

func connectStream(e *env, key string, req *cohortv1.StreamChatCompletionRequest) ([]*cohortv1.ChatCompletionChunk, error) {
	client := cohortv1connect.NewChatServiceClient(e.HTTPClient(), e.URL)
	r := connect.NewRequest(req)
	if key != "" {
		r.Header().Set("Authorization", "Bearer "+key)
	}
	res, err := client.StreamChatCompletion(context.Background(), r)
	if err != nil {
		return nil, err
	}
	defer res.Close()
	var out []*cohortv1.ChatCompletionChunk
	for res.Receive() {
		out = append(out, res.Msg().GetChunk())
	}
	return out, res.Err()
}

// TestConnectDoor: the typed door streams the same chunks the REST door
// turns into SSE (byte-identical once encoded), and refuses with the same
// status and reason as a Connect error detail.
func TestConnectDoor(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		e := newEnv(t, db)
		for _, c := range streamCases {
			e.d.set(c.sc, c.sc)
			// The REST body was decoded by the REST door; decode it the same
			// way so both doors get the same typed request.
			req, err := chat.DecodeRequest([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			req.InternId = e.InternID
			chunks, err := connectStream(e, e.WorkspaceKey, req)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			var sseBody []byte
			for _, ch := range chunks {
				sseBody = sse.Event(sseBody, ch)
			}
			sseBody = append(sseBody, "data: [DONE]\n\n"...)
			golden(t, "testdata/"+c.name+".golden", string(sseBody))
			e.d.waitEnded(t)
		}

		refusals := []struct {
			name   string
			key    string
			req    *cohortv1.StreamChatCompletionRequest
			sc     script
			code   connect.Code
			status int
			reason apierr.Reason
		}{
			{"no key", "", &cohortv1.StreamChatCompletionRequest{InternId: e.InternID}, nil, connect.CodeUnauthenticated, 0, ""},
			{"bad request", e.WorkspaceKey, &cohortv1.StreamChatCompletionRequest{InternId: e.InternID}, nil, connect.CodeInvalidArgument, 400, "bad_request"},
			{"prompt past the bound", e.WorkspaceKey, &cohortv1.StreamChatCompletionRequest{InternId: e.InternID, Messages: []*cohortv1.ChatMessage{{Role: "user", Content: ptr(string(make([]rune, 32001)))}}}, nil, connect.CodeInvalidArgument, 400, "bad_request"},
			{"message past 1 MiB", e.WorkspaceKey, &cohortv1.StreamChatCompletionRequest{InternId: e.InternID, Messages: []*cohortv1.ChatMessage{{Role: "system", Content: ptr(strings.Repeat("x", 1<<20))}, {Role: "user", Content: ptr("hi")}}}, nil, connect.CodeResourceExhausted, 0, ""},
			{"unknown intern", e.WorkspaceKey, &cohortv1.StreamChatCompletionRequest{InternId: uuid.NewString(), Messages: []*cohortv1.ChatMessage{{Role: "user", Content: ptr("hi")}}}, nil, connect.CodeNotFound, 404, "not_found"},
			{"busy", e.WorkspaceKey, &cohortv1.StreamChatCompletionRequest{InternId: e.InternID, Messages: []*cohortv1.ChatMessage{{Role: "user", Content: ptr("hi")}}}, events(refuse(409, "busy")), connect.CodeFailedPrecondition, 409, "busy"},
			{"interaction_unknown", e.WorkspaceKey, &cohortv1.StreamChatCompletionRequest{InternId: e.InternID, SessionId: ptr("s"), Messages: []*cohortv1.ChatMessage{{Role: "tool", ToolCallId: "i", Content: ptr("allow_once")}}}, events(refuse(404, "interaction_unknown")), connect.CodeNotFound, 404, "interaction_unknown"},
		}
		for _, c := range refusals {
			e.d.set(c.sc, c.sc)
			_, err := connectStream(e, c.key, c.req)
			var ce *connect.Error
			if !errors.As(err, &ce) || ce.Code() != c.code {
				t.Errorf("%s: err %v, want code %v", c.name, err, c.code)
				continue
			}
			if c.status != 0 {
				if got := apierr.FromConnect(err); got.Status != c.status || got.Reason != c.reason {
					t.Errorf("%s: %d %s, want %d %s", c.name, got.Status, got.Reason, c.status, c.reason)
				}
			}
			if c.sc != nil {
				e.d.waitEnded(t)
			}
		}
	})
}

// A request past the Connect door's read bound is the caller's error
// (resource exhausted), not a server fault: nothing is logged as a 500.
func TestOversizedConnectRequestIsNotAFault(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))
	_, err := connectStream(e, e.WorkspaceKey, &cohortv1.StreamChatCompletionRequest{InternId: e.InternID,
		Messages: []*cohortv1.ChatMessage{{Role: "system", Content: ptr(strings.Repeat("x", 1<<20))}, {Role: "user", Content: ptr("hi")}}})
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("err %v", err)
	}
	if logs := e.Logs(); strings.Contains(logs, `"status":500`) || strings.Contains(logs, "level=ERROR") || strings.Contains(logs, `"level":"ERROR"`) {
		t.Fatalf("logged as a fault:\n%s", logs)
	}
}
