package interns

import (
	"context"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
)

// Handler is the Connect door onto Service.
type Handler struct{ S *Service }

var _ cohortv1connect.InternServiceHandler = Handler{}

func (h Handler) CreateIntern(ctx context.Context, req *connect.Request[cohortv1.CreateInternRequest]) (*connect.Response[cohortv1.CreateInternResponse], error) {
	in, err := h.S.Create(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.CreateInternResponse{Intern: in}), nil
}

func (h Handler) GetIntern(ctx context.Context, req *connect.Request[cohortv1.GetInternRequest]) (*connect.Response[cohortv1.GetInternResponse], error) {
	in, err := h.S.Get(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.GetInternResponse{Intern: in}), nil
}

func (h Handler) ListInterns(ctx context.Context, req *connect.Request[cohortv1.ListInternsRequest]) (*connect.Response[cohortv1.ListInternsResponse], error) {
	ins, err := h.S.List(ctx, auth.From(ctx), req.Msg.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.ListInternsResponse{Interns: ins}), nil
}

func (h Handler) UpdateIntern(ctx context.Context, req *connect.Request[cohortv1.UpdateInternRequest]) (*connect.Response[cohortv1.UpdateInternResponse], error) {
	in, err := h.S.Update(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.UpdateInternResponse{Intern: in}), nil
}

func (h Handler) SuspendIntern(ctx context.Context, req *connect.Request[cohortv1.SuspendInternRequest]) (*connect.Response[cohortv1.SuspendInternResponse], error) {
	in, err := h.S.Suspend(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.SuspendInternResponse{Intern: in}), nil
}

func (h Handler) ResumeIntern(ctx context.Context, req *connect.Request[cohortv1.ResumeInternRequest]) (*connect.Response[cohortv1.ResumeInternResponse], error) {
	in, err := h.S.Resume(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.ResumeInternResponse{Intern: in}), nil
}

func (h Handler) DeleteIntern(ctx context.Context, req *connect.Request[cohortv1.DeleteInternRequest]) (*connect.Response[cohortv1.DeleteInternResponse], error) {
	in, err := h.S.Delete(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.DeleteInternResponse{Intern: in}), nil
}
