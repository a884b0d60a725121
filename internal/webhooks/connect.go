package webhooks

import (
	"context"

	"connectrpc.com/connect"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
)

// Handler is the Connect door onto Service: decode, call, encode.
type Handler struct{ S *Service }

var _ cohortv1connect.WebhookServiceHandler = Handler{}

func door[Req, Res any](ctx context.Context, req *connect.Request[Req], f func(context.Context, *auth.Principal, *Req) (*Res, error)) (*connect.Response[Res], error) {
	res, err := f(ctx, auth.From(ctx), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

func (h Handler) CreateWebhookEndpoint(ctx context.Context, r *connect.Request[cohortv1.CreateWebhookEndpointRequest]) (*connect.Response[cohortv1.CreateWebhookEndpointResponse], error) {
	return door(ctx, r, h.S.Create)
}

func (h Handler) GetWebhookEndpoint(ctx context.Context, r *connect.Request[cohortv1.GetWebhookEndpointRequest]) (*connect.Response[cohortv1.GetWebhookEndpointResponse], error) {
	return door(ctx, r, h.S.Get)
}

func (h Handler) ListWebhookEndpoints(ctx context.Context, r *connect.Request[cohortv1.ListWebhookEndpointsRequest]) (*connect.Response[cohortv1.ListWebhookEndpointsResponse], error) {
	return door(ctx, r, h.S.List)
}

func (h Handler) UpdateWebhookEndpoint(ctx context.Context, r *connect.Request[cohortv1.UpdateWebhookEndpointRequest]) (*connect.Response[cohortv1.UpdateWebhookEndpointResponse], error) {
	return door(ctx, r, h.S.Update)
}

func (h Handler) RotateWebhookSecret(ctx context.Context, r *connect.Request[cohortv1.RotateWebhookSecretRequest]) (*connect.Response[cohortv1.RotateWebhookSecretResponse], error) {
	return door(ctx, r, h.S.Rotate)
}

func (h Handler) DeleteWebhookEndpoint(ctx context.Context, r *connect.Request[cohortv1.DeleteWebhookEndpointRequest]) (*connect.Response[cohortv1.DeleteWebhookEndpointResponse], error) {
	return door(ctx, r, h.S.Delete)
}

func (h Handler) ListWebhookDeliveries(ctx context.Context, r *connect.Request[cohortv1.ListWebhookDeliveriesRequest]) (*connect.Response[cohortv1.ListWebhookDeliveriesResponse], error) {
	return door(ctx, r, h.S.Deliveries)
}

func (h Handler) RedeliverWebhook(ctx context.Context, r *connect.Request[cohortv1.RedeliverWebhookRequest]) (*connect.Response[cohortv1.RedeliverWebhookResponse], error) {
	return door(ctx, r, h.S.Redeliver)
}
