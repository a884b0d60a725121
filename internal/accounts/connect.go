package accounts

import (
	"context"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
)

// AdminHandler is the Connect door onto Service: decode, call, encode.
type AdminHandler struct{ S *Service }

var _ cohortv1connect.AdminServiceHandler = AdminHandler{}

func (h AdminHandler) GetOrganization(ctx context.Context, _ *connect.Request[cohortv1.GetOrganizationRequest]) (*connect.Response[cohortv1.GetOrganizationResponse], error) {
	o, err := h.S.GetOrganization(ctx, auth.From(ctx))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.GetOrganizationResponse{Organization: o}), nil
}

func (h AdminHandler) CreateUser(ctx context.Context, req *connect.Request[cohortv1.CreateUserRequest]) (*connect.Response[cohortv1.CreateUserResponse], error) {
	// Over the API the caller's organization is used, whatever the request says.
	req.Msg.OrganizationId = ""
	u, err := h.S.CreateUser(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.CreateUserResponse{User: u}), nil
}

func (h AdminHandler) ListUsers(ctx context.Context, _ *connect.Request[cohortv1.ListUsersRequest]) (*connect.Response[cohortv1.ListUsersResponse], error) {
	us, err := h.S.ListUsers(ctx, auth.From(ctx))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.ListUsersResponse{Users: us}), nil
}

func (h AdminHandler) MarkUserLeft(ctx context.Context, req *connect.Request[cohortv1.MarkUserLeftRequest]) (*connect.Response[cohortv1.MarkUserLeftResponse], error) {
	u, err := h.S.MarkUserLeft(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.MarkUserLeftResponse{User: u}), nil
}

func (h AdminHandler) CreateGrant(ctx context.Context, req *connect.Request[cohortv1.CreateGrantRequest]) (*connect.Response[cohortv1.CreateGrantResponse], error) {
	g, err := h.S.CreateGrant(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.CreateGrantResponse{Grant: g}), nil
}

func (h AdminHandler) CreateApiKey(ctx context.Context, req *connect.Request[cohortv1.CreateApiKeyRequest]) (*connect.Response[cohortv1.CreateApiKeyResponse], error) {
	req.Msg.OrganizationId = ""
	res, err := h.S.CreateAPIKey(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

func (h AdminHandler) ListApiKeys(ctx context.Context, req *connect.Request[cohortv1.ListApiKeysRequest]) (*connect.Response[cohortv1.ListApiKeysResponse], error) {
	ks, err := h.S.ListAPIKeys(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.ListApiKeysResponse{ApiKeys: ks}), nil
}

func (h AdminHandler) DisableApiKey(ctx context.Context, req *connect.Request[cohortv1.DisableApiKeyRequest]) (*connect.Response[cohortv1.DisableApiKeyResponse], error) {
	k, err := h.S.DisableAPIKey(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.DisableApiKeyResponse{ApiKey: k}), nil
}

func (h AdminHandler) EnableApiKey(ctx context.Context, req *connect.Request[cohortv1.EnableApiKeyRequest]) (*connect.Response[cohortv1.EnableApiKeyResponse], error) {
	k, err := h.S.EnableAPIKey(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.EnableApiKeyResponse{ApiKey: k}), nil
}

func (h AdminHandler) DeleteApiKey(ctx context.Context, req *connect.Request[cohortv1.DeleteApiKeyRequest]) (*connect.Response[cohortv1.DeleteApiKeyResponse], error) {
	k, err := h.S.DeleteAPIKey(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.DeleteApiKeyResponse{ApiKey: k}), nil
}
