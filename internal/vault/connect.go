package vault

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
)

// Handler is the Connect door onto Service.
type Handler struct{ S *Service }

var _ cohortv1connect.VaultServiceHandler = Handler{}

// PutInternSecret creates or replaces a secret; see Service.Put.
func (h Handler) PutInternSecret(ctx context.Context, req *connect.Request[cohortv1.PutInternSecretRequest]) (*connect.Response[cohortv1.PutInternSecretResponse], error) {
	res, err := h.S.Put(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// ListInternSecrets lists an intern's secrets; see Service.ListIntern.
func (h Handler) ListInternSecrets(ctx context.Context, req *connect.Request[cohortv1.ListInternSecretsRequest]) (*connect.Response[cohortv1.ListInternSecretsResponse], error) {
	return respond(h.S.ListIntern(ctx, auth.From(ctx), req.Msg))
}

// DeleteInternSecret deletes an intern's secret; see Service.DeleteIntern.
func (h Handler) DeleteInternSecret(ctx context.Context, req *connect.Request[cohortv1.DeleteInternSecretRequest]) (*connect.Response[cohortv1.DeleteInternSecretResponse], error) {
	return respond(h.S.DeleteIntern(ctx, auth.From(ctx), req.Msg))
}

// PutWorkspaceSecret creates or replaces a workspace secret; see Service.PutWorkspace.
func (h Handler) PutWorkspaceSecret(ctx context.Context, req *connect.Request[cohortv1.PutWorkspaceSecretRequest]) (*connect.Response[cohortv1.PutWorkspaceSecretResponse], error) {
	return respond(h.S.PutWorkspace(ctx, auth.From(ctx), req.Msg))
}

// ListWorkspaceSecrets lists the workspace's secrets; see Service.ListWorkspace.
func (h Handler) ListWorkspaceSecrets(ctx context.Context, req *connect.Request[cohortv1.ListWorkspaceSecretsRequest]) (*connect.Response[cohortv1.ListWorkspaceSecretsResponse], error) {
	return respond(h.S.ListWorkspace(ctx, auth.From(ctx), req.Msg))
}

// DeleteWorkspaceSecret deletes a workspace secret; see Service.DeleteWorkspace.
func (h Handler) DeleteWorkspaceSecret(ctx context.Context, req *connect.Request[cohortv1.DeleteWorkspaceSecretRequest]) (*connect.Response[cohortv1.DeleteWorkspaceSecretResponse], error) {
	return respond(h.S.DeleteWorkspace(ctx, auth.From(ctx), req.Msg))
}

func respond[T any](msg *T, err error) (*connect.Response[T], error) {
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(msg), nil
}

// AdminHandler is the Connect door of VaultAdminService.
type AdminHandler struct{ S *Service }

var _ cohortv1connect.VaultAdminServiceHandler = AdminHandler{}

// ListSecretReleases lists audited release decisions; see Service.ListReleases.
func (h AdminHandler) ListSecretReleases(ctx context.Context, req *connect.Request[cohortv1.ListSecretReleasesRequest]) (*connect.Response[cohortv1.ListSecretReleasesResponse], error) {
	return respond(h.S.ListReleases(ctx, auth.From(ctx), req.Msg))
}

// NewConnectHandler returns the Connect door's path and handler. The
// caller's access (Service.Admit, the request's host through
// auth.WithHost) is declared where it is mounted (internal/server).
func NewConnectHandler(s *Service, opts ...connect.HandlerOption) (string, http.Handler) {
	return cohortv1connect.NewVaultServiceHandler(Handler{S: s}, append(opts, connect.WithReadMaxBytes(MaxBody))...)
}
