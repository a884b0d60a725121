package workspaces

import (
	"context"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
)

// Handler is the Connect door onto Service.
type Handler struct{ S *Service }

var _ cohortv1connect.WorkspaceServiceHandler = Handler{}

func (h Handler) CreateWorkspace(ctx context.Context, req *connect.Request[cohortv1.CreateWorkspaceRequest]) (*connect.Response[cohortv1.CreateWorkspaceResponse], error) {
	w, err := h.S.Create(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.CreateWorkspaceResponse{Data: w}), nil
}

func (h Handler) GetWorkspace(ctx context.Context, req *connect.Request[cohortv1.GetWorkspaceRequest]) (*connect.Response[cohortv1.GetWorkspaceResponse], error) {
	w, err := h.S.Get(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.GetWorkspaceResponse{Data: w}), nil
}

func (h Handler) ListWorkspaces(ctx context.Context, _ *connect.Request[cohortv1.ListWorkspacesRequest]) (*connect.Response[cohortv1.ListWorkspacesResponse], error) {
	ws, err := h.S.List(ctx, auth.From(ctx))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.ListWorkspacesResponse{Data: ws}), nil
}
