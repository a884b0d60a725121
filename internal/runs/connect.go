package runs

import (
	"context"
	"encoding/json"
	"strconv"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/store"
)

// Handler is the Connect door onto Manager (RunService): the same
// functions as the REST routes; refusals are returned as errors (the
// apierr interceptor maps them).
type Handler struct{ M *Manager }

var _ cohortv1connect.RunServiceHandler = Handler{}

// GetRun is the typed GET run.
func (h Handler) GetRun(ctx context.Context, req *connect.Request[cohortv1.GetRunRequest]) (*connect.Response[cohortv1.GetRunResponse], error) {
	run, err := h.M.GetRun(ctx, auth.From(ctx), req.Msg.GetInternId(), req.Msg.GetRunId())
	if err != nil {
		return nil, err
	}
	pb, err := toProto(run)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.GetRunResponse{Run: pb}), nil
}

// ListSessionRuns is the typed list of a session's runs.
func (h Handler) ListSessionRuns(ctx context.Context, req *connect.Request[cohortv1.ListSessionRunsRequest]) (*connect.Response[cohortv1.ListSessionRunsResponse], error) {
	runs, err := h.M.ListSessionRuns(ctx, auth.From(ctx), req.Msg.GetInternId(), req.Msg.GetSessionId())
	if err != nil {
		return nil, err
	}
	out := &cohortv1.ListSessionRunsResponse{Runs: make([]*cohortv1.Run, 0, len(runs))}
	for i := range runs {
		pb, err := toProto(&runs[i])
		if err != nil {
			return nil, err
		}
		out.Runs = append(out.Runs, pb)
	}
	return connect.NewResponse(out), nil
}

// CancelRun is the typed cancel.
func (h Handler) CancelRun(ctx context.Context, req *connect.Request[cohortv1.CancelRunRequest]) (*connect.Response[cohortv1.CancelRunResponse], error) {
	run, err := h.M.CancelRun(ctx, auth.From(ctx), req.Msg.GetInternId(), req.Msg.GetRunId())
	if err != nil {
		return nil, err
	}
	pb, err := toProto(run)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.CancelRunResponse{Run: pb}), nil
}

// StreamRunEvents is the typed event stream: each stored chunk with its
// sequence number, a keepalive message (no chunk, seq 0) after
// Config.Keepalive of silence; the stream ends when the run has ended.
func (h Handler) StreamRunEvents(ctx context.Context, req *connect.Request[cohortv1.StreamRunEventsRequest], out *connect.ServerStream[cohortv1.StreamRunEventsResponse]) error {
	run, err := h.M.GetRun(ctx, auth.From(ctx), req.Msg.GetInternId(), req.Msg.GetRunId())
	if err != nil {
		return err
	}
	after := req.Msg.GetAfter()
	if after < 0 {
		return errAfter(strconv.FormatInt(after, 10))
	}
	return h.M.Tail(ctx, run, after, func(evs []store.RunEvent) error {
		for _, ev := range evs {
			c, err := chunkFrom(ev.Data)
			if err != nil {
				return apierr.Bug("run %s chunk %d does not read back: %v", run.ID, ev.Seq, err)
			}
			if err := out.Send(&cohortv1.StreamRunEventsResponse{Seq: ev.Seq, Chunk: c}); err != nil {
				return err
			}
		}
		return nil
	}, func() error {
		// A paused run is silent for as long as its question waits:
		// without this, idle timeouts of proxies cut the stream.
		return out.Send(&cohortv1.StreamRunEventsResponse{Keepalive: true})
	})
}

// toProto is the run object (toObject) as RunService shows it.
func toProto(r *store.Run) (*cohortv1.Run, error) {
	o := toObject(r)
	pb := &cohortv1.Run{Id: o.ID, InternId: o.InternID, SessionId: o.SessionID, Status: o.Status, PauseDeadline: o.PauseDeadline,
		CancelRequested: o.CancelRequested, LastEventId: o.LastEventID, EventsTruncated: o.EventsTruncated,
		CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt, EndedAt: o.EndedAt, Usage: usageFrom(r.Usage)}
	if string(o.PendingInteraction) != "null" {
		var tc wireToolCall
		if err := json.Unmarshal(o.PendingInteraction, &tc); err != nil {
			return nil, apierr.Bug("run %s: pending interaction does not read back: %v", r.ID, err)
		}
		pb.PendingInteraction = tc.proto()
	}
	if string(o.Error) != "null" {
		var e wireError
		if err := json.Unmarshal(o.Error, &e); err != nil {
			return nil, apierr.Bug("run %s: error does not read back: %v", r.ID, err)
		}
		pb.Error = e.proto()
	}
	return pb, nil
}

// The chunk JSON sse.AppendChunk writes, read back into the chat stream's
// message.
type wireToolCall struct {
	Index    int32  `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func (tc *wireToolCall) proto() *cohortv1.ToolCall {
	return &cohortv1.ToolCall{Index: tc.Index, Id: tc.ID, Type: tc.Type,
		Function: &cohortv1.FunctionCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments}}
}

type wireError struct {
	Code     int32  `json:"code"`
	Message  string `json:"message"`
	Metadata *struct {
		Reason string `json:"reason"`
	} `json:"metadata"`
}

func (e *wireError) proto() *cohortv1.ChunkError {
	out := &cohortv1.ChunkError{Code: e.Code, Message: e.Message}
	if e.Metadata != nil {
		out.Reason = e.Metadata.Reason
	}
	return out
}

func chunkFrom(data string) (*cohortv1.ChatCompletionChunk, error) {
	var w struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Index int32 `json:"index"`
			Delta struct {
				Role      *string        `json:"role"`
				Content   *string        `json:"content"`
				Reasoning *string        `json:"reasoning"`
				ToolCalls []wireToolCall `json:"tool_calls"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Error     *wireError      `json:"error"`
		SessionID *string         `json:"session_id"`
		Usage     json.RawMessage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(data), &w); err != nil {
		return nil, err
	}
	c := &cohortv1.ChatCompletionChunk{Id: w.ID, Object: w.Object, Created: w.Created, Model: w.Model, SessionId: w.SessionID}
	for _, ch := range w.Choices {
		d := &cohortv1.ChatDelta{Role: ch.Delta.Role, Content: ch.Delta.Content, Reasoning: ch.Delta.Reasoning}
		for i := range ch.Delta.ToolCalls {
			d.ToolCalls = append(d.ToolCalls, ch.Delta.ToolCalls[i].proto())
		}
		c.Choices = append(c.Choices, &cohortv1.ChatChoice{Index: ch.Index, FinishReason: ch.FinishReason, Delta: d})
	}
	if w.Error != nil {
		c.Error = w.Error.proto()
	}
	if len(w.Usage) > 0 && string(w.Usage) != "null" {
		c.Usage = usageFrom(string(w.Usage))
	}
	return c, nil
}
