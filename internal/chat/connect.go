package chat

import (
	"context"
	"io"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
)

// Handler is the Connect door onto Service: refusals are returned as errors
// (the apierr interceptor maps them), chunks are sent as they come.
type Handler struct{ S *Service }

var _ cohortv1connect.ChatServiceHandler = Handler{}

// StreamChatCompletion opens the stream and relays every chunk.
func (h Handler) StreamChatCompletion(ctx context.Context, req *connect.Request[cohortv1.StreamChatCompletionRequest], out *connect.ServerStream[cohortv1.StreamChatCompletionResponse]) error {
	if h.S.background(ctx, req.Msg) {
		return h.S.startBackground(ctx, auth.From(ctx), req.Msg, out)
	}
	st, err := h.S.Open(ctx, auth.From(ctx), req.Msg)
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
			return errClientClosed.WithCause(err)
		}
		if err := out.Send(&cohortv1.StreamChatCompletionResponse{Chunk: c}); err != nil {
			return errClientClosed.WithCause(err)
		}
	}
}
