package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
)

// scriptedDaemon is an intern daemon without an agent: StartTurn streams
// the schedule of its prompt (benchPrompt) as run events at once. Behind
// the gateway it stands for an upstream faster than the gateway, so what
// the bench measures through it is the gateway's own cost and capacity,
// not the agent's pace.
type scriptedDaemon struct {
	interndv1connect.UnimplementedInternDaemonServiceHandler
}

func (scriptedDaemon) Status(context.Context, *connect.Request[pb.StatusRequest]) (*connect.Response[pb.StatusResponse], error) {
	return connect.NewResponse(&pb.StatusResponse{Agent: "scripted", Model: "bench/model"}), nil
}

func (scriptedDaemon) StartTurn(ctx context.Context, req *connect.Request[pb.StartTurnRequest], st *connect.ServerStream[pb.StartTurnResponse]) error {
	n, interval, hang := 1, time.Duration(0), false
	if g := benchPromptRE.FindStringSubmatch(req.Msg.GetPrompt()); g != nil {
		n, _ = strconv.Atoi(g[1])
		interval, _ = time.ParseDuration(g[2])
		hang = g[3] == "true"
	}
	const runID = "run_bench"
	seq := uint64(0)
	send := func(ev *pb.RunEvent) error {
		seq++
		ev.Seq, ev.RunId = seq, runID
		return st.Send(&pb.StartTurnResponse{Event: ev})
	}
	if err := send(&pb.RunEvent{Event: &pb.RunEvent_Started{Started: &pb.Started{SessionId: req.Msg.GetSessionId(), RunId: runID}}}); err != nil {
		return err
	}
	start := time.Now()
	for i := range n {
		if interval > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		}
		ev := &pb.RunEvent{Model: "bench/model", Event: &pb.RunEvent_Text{Text: &pb.TextDelta{Text: fmt.Sprintf("token %06d ", i)}}}
		if err := send(ev); err != nil {
			return err
		}
	}
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	usage := &pb.Usage{PromptTokens: 5, CompletionTokens: int64(n), TotalTokens: int64(n) + 5}
	if err := send(&pb.RunEvent{Model: "bench/model", Event: &pb.RunEvent_Usage{Usage: usage}}); err != nil {
		return err
	}
	return send(&pb.RunEvent{Model: "bench/model", Event: &pb.RunEvent_Finished{Finished: &pb.Finished{Reason: pb.Finished_REASON_STOP}}})
}
