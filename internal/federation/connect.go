package federation

import (
	"context"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
)

// Handler is the Connect door onto Service: decode, call, encode.
type Handler struct{ S *Service }

var _ cohortv1connect.FederationServiceHandler = Handler{}

// CreateIssuer is the Connect door of Service.CreateIssuer.
func (h Handler) CreateIssuer(ctx context.Context, req *connect.Request[cohortv1.CreateIssuerRequest]) (*connect.Response[cohortv1.CreateIssuerResponse], error) {
	i, err := h.S.CreateIssuer(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.CreateIssuerResponse{Issuer: i}), nil
}

// GetIssuer is the Connect door of Service.GetIssuer.
func (h Handler) GetIssuer(ctx context.Context, req *connect.Request[cohortv1.GetIssuerRequest]) (*connect.Response[cohortv1.GetIssuerResponse], error) {
	i, err := h.S.GetIssuer(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.GetIssuerResponse{Issuer: i}), nil
}

// ListIssuers is the Connect door of Service.ListIssuers.
func (h Handler) ListIssuers(ctx context.Context, _ *connect.Request[cohortv1.ListIssuersRequest]) (*connect.Response[cohortv1.ListIssuersResponse], error) {
	is, err := h.S.ListIssuers(ctx, auth.From(ctx))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.ListIssuersResponse{Issuers: is}), nil
}

// UpdateIssuer is the Connect door of Service.UpdateIssuer.
func (h Handler) UpdateIssuer(ctx context.Context, req *connect.Request[cohortv1.UpdateIssuerRequest]) (*connect.Response[cohortv1.UpdateIssuerResponse], error) {
	i, err := h.S.UpdateIssuer(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.UpdateIssuerResponse{Issuer: i}), nil
}

// DeleteIssuer is the Connect door of Service.DeleteIssuer.
func (h Handler) DeleteIssuer(ctx context.Context, req *connect.Request[cohortv1.DeleteIssuerRequest]) (*connect.Response[cohortv1.DeleteIssuerResponse], error) {
	n, err := h.S.DeleteIssuer(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.DeleteIssuerResponse{DeletedPolicies: int32(n)}), nil
}

// CreatePolicy is the Connect door of Service.CreatePolicy.
func (h Handler) CreatePolicy(ctx context.Context, req *connect.Request[cohortv1.CreatePolicyRequest]) (*connect.Response[cohortv1.CreatePolicyResponse], error) {
	p, err := h.S.CreatePolicy(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.CreatePolicyResponse{Policy: p}), nil
}

// GetPolicy is the Connect door of Service.GetPolicy.
func (h Handler) GetPolicy(ctx context.Context, req *connect.Request[cohortv1.GetPolicyRequest]) (*connect.Response[cohortv1.GetPolicyResponse], error) {
	p, err := h.S.GetPolicy(ctx, auth.From(ctx), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.GetPolicyResponse{Policy: p}), nil
}

// ListPolicies is the Connect door of Service.ListPolicies.
func (h Handler) ListPolicies(ctx context.Context, req *connect.Request[cohortv1.ListPoliciesRequest]) (*connect.Response[cohortv1.ListPoliciesResponse], error) {
	ps, err := h.S.ListPolicies(ctx, auth.From(ctx), req.Msg.GetIssuerId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.ListPoliciesResponse{Policies: ps}), nil
}

// UpdatePolicy is the Connect door of Service.UpdatePolicy.
func (h Handler) UpdatePolicy(ctx context.Context, req *connect.Request[cohortv1.UpdatePolicyRequest]) (*connect.Response[cohortv1.UpdatePolicyResponse], error) {
	p, err := h.S.UpdatePolicy(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.UpdatePolicyResponse{Policy: p}), nil
}

// DeletePolicy is the Connect door of Service.DeletePolicy.
func (h Handler) DeletePolicy(ctx context.Context, req *connect.Request[cohortv1.DeletePolicyRequest]) (*connect.Response[cohortv1.DeletePolicyResponse], error) {
	if err := h.S.DeletePolicy(ctx, auth.From(ctx), req.Msg.GetId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.DeletePolicyResponse{}), nil
}

// SetClaimCheck is the Connect door of Service.SetClaimCheck.
func (h Handler) SetClaimCheck(ctx context.Context, req *connect.Request[cohortv1.SetClaimCheckRequest]) (*connect.Response[cohortv1.SetClaimCheckResponse], error) {
	p, err := h.S.SetClaimCheck(ctx, auth.From(ctx), req.Msg.GetPolicyId(), req.Msg.GetCheck())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.SetClaimCheckResponse{Policy: p}), nil
}

// RemoveClaimCheck is the Connect door of Service.RemoveClaimCheck.
func (h Handler) RemoveClaimCheck(ctx context.Context, req *connect.Request[cohortv1.RemoveClaimCheckRequest]) (*connect.Response[cohortv1.RemoveClaimCheckResponse], error) {
	p, err := h.S.RemoveClaimCheck(ctx, auth.From(ctx), req.Msg.GetPolicyId(), req.Msg.GetKind())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cohortv1.RemoveClaimCheckResponse{Policy: p}), nil
}

// ValidateCondition is the Connect door of Service.ValidateCondition.
func (h Handler) ValidateCondition(ctx context.Context, req *connect.Request[cohortv1.ValidateConditionRequest]) (*connect.Response[cohortv1.ValidateConditionResponse], error) {
	res, err := h.S.ValidateCondition(ctx, auth.From(ctx), req.Msg.GetCondition())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// DryRun is the Connect door of Service.DryRun.
func (h Handler) DryRun(ctx context.Context, req *connect.Request[cohortv1.DryRunRequest]) (*connect.Response[cohortv1.DryRunResponse], error) {
	res, err := h.S.DryRun(ctx, auth.From(ctx), req.Msg.GetPolicyId(), req.Msg.GetSubjectToken())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// ListExchanges is the Connect door of Service.ListExchanges.
func (h Handler) ListExchanges(ctx context.Context, req *connect.Request[cohortv1.ListExchangesRequest]) (*connect.Response[cohortv1.ListExchangesResponse], error) {
	res, err := h.S.ListExchanges(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}
