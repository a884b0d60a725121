package client_test

import (
	"context"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/cohort-dev/cohort/client"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestClientCarriesTheKey: the client's key reaches unary calls and
// streams (a stream without it is refused unauthenticated, which is what a
// connect.UnaryInterceptorFunc gives), another workspace's intern is not
// found with the spec's reason, and a wrong key is unauthenticated.
func TestClientCarriesTheKey(t *testing.T) {
	e := testenv.New(t, storetest.SQLite(t))
	base := e.URL
	c := client.New(base, e.WorkspaceKey, client.WithHTTPClient(e.HTTPClient()))
	ctx := context.Background()

	list, err := c.Interns.ListInterns(ctx, connect.NewRequest(&cohortv1.ListInternsRequest{}))
	if err != nil || len(list.Msg.GetInterns()) != 1 || list.Msg.GetInterns()[0].GetId() != e.InternID {
		t.Fatalf("list interns: %v %v", err, list)
	}

	// A stream: the intern has no daemon here, so the turn is refused, but
	// for that reason, not for a missing credential.
	stream := func(cl cohortv1connect.ChatServiceClient) error {
		content := "hello"
		s, err := cl.StreamChatCompletion(ctx, connect.NewRequest(&cohortv1.StreamChatCompletionRequest{InternId: e.InternID,
			Messages: []*cohortv1.ChatMessage{{Role: "user", Content: &content}}}))
		if err != nil {
			return err
		}
		defer s.Close()
		for s.Receive() {
		}
		return s.Err()
	}
	if err := stream(c.Chat); connect.CodeOf(err) == connect.CodeUnauthenticated {
		t.Fatalf("the client's stream went without its key: %v", err)
	}
	unaryOnly := cohortv1connect.NewChatServiceClient(e.HTTPClient(), base, connect.WithInterceptors(connect.UnaryInterceptorFunc(
		func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+e.WorkspaceKey)
				return next(ctx, req)
			}
		})))
	if err := stream(unaryOnly); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a unary-only interceptor's stream: %v, want unauthenticated (the case Bearer exists for)", err)
	}

	_, err = c.Interns.GetIntern(ctx, connect.NewRequest(&cohortv1.GetInternRequest{Id: "00000000-0000-4000-8000-000000000000"}))
	if connect.CodeOf(err) != connect.CodeNotFound || client.Reason(err) != "not_found" {
		t.Fatalf("an unknown intern: %v (reason %q)", err, client.Reason(err))
	}
	bad := client.New(base, "cohort_wk_not-a-key", client.WithHTTPClient(http.DefaultClient))
	if _, err := bad.Interns.ListInterns(ctx, connect.NewRequest(&cohortv1.ListInternsRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a wrong key: %v", err)
	}
}
