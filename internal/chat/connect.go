package chat

import (
	"context"
	"io"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/runs"
	"github.com/cohort-dev/cohort/internal/turn"
)

// Handler is the Connect door onto Service: refusals are returned as errors
// (the apierr interceptor maps them), chunks are sent as they come. Runs
// starts the background runs; nil refuses a request with "background":
// true.
type Handler struct {
	S    *Service
	Runs *runs.Manager
}

var _ cohortv1connect.ChatServiceHandler = Handler{}

// StreamChatCompletion opens the stream and relays every chunk.
func (h Handler) StreamChatCompletion(ctx context.Context, req *connect.Request[cohortv1.StreamChatCompletionRequest], out *connect.ServerStream[cohortv1.StreamChatCompletionResponse]) error {
	p := auth.From(ctx)
	load := h.S.load(ctx, p, req.Msg)
	if background(ctx, h.Runs, req.Msg) {
		return startBackground(ctx, h.Runs, p, req.Msg, load, out)
	}
	st, err := h.S.Open(ctx, p, req.Msg, load, turn.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	for {
		c, err := st.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return turn.ErrClientClosed.WithCause(err)
		}
		if err := out.Send(&cohortv1.StreamChatCompletionResponse{Chunk: c}); err != nil {
			return turn.ErrClientClosed.WithCause(err)
		}
	}
}
