package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/webhooks"
)

// hookCmds are these admin commands by name.
func hookCmds() map[string]adminCmd {
	return map[string]adminCmd{
		"webhook create": {"--org ID --workspace ID --url URL --events E,… [--description D] [--enabled false]   (prints the secret, once)", []string{"org", "user", "workspace", "url", "events", "description", "enabled", "serve-webhook-egress"}, hookCmd(func(ctx context.Context, e *adminEnv, s *webhooks.Service, p *auth.Principal) error {
			req := &cohortv1.CreateWebhookEndpointRequest{WorkspaceId: e.f.workspace, Url: e.f.url, Events: config.SplitList(e.f.events), Description: e.f.description}
			var err error
			if req.Enabled, err = enabledFlag(e.f.enabled); err != nil {
				return err
			}
			res, err := s.Create(ctx, p, req)
			if err != nil {
				return err
			}
			return e.printOne(res)
		})},
		"webhook list": {"--org ID --workspace ID", []string{"org", "user", "workspace", "serve-webhook-egress"}, hookCmd(func(ctx context.Context, e *adminEnv, s *webhooks.Service, p *auth.Principal) error {
			res, err := s.List(ctx, p, &cohortv1.ListWebhookEndpointsRequest{WorkspaceId: e.f.workspace})
			if err != nil {
				return err
			}
			return e.print(protos(res.GetEndpoints())...)
		})},
		"webhook get": {"--org ID --id ENDPOINT_ID", []string{"org", "user", "id", "serve-webhook-egress"}, hookCmd(func(ctx context.Context, e *adminEnv, s *webhooks.Service, p *auth.Principal) error {
			res, err := s.Get(ctx, p, &cohortv1.GetWebhookEndpointRequest{Id: e.f.id})
			if err != nil {
				return err
			}
			return e.printOne(res.GetEndpoint())
		})},
		"webhook update": {"--org ID --id ENDPOINT_ID [--url URL] [--events E,…] [--description D] [--enabled true|false]", []string{"org", "user", "id", "url", "events", "description", "enabled", "serve-webhook-egress"}, hookCmd(func(ctx context.Context, e *adminEnv, s *webhooks.Service, p *auth.Principal) error {
			req := &cohortv1.UpdateWebhookEndpointRequest{Id: e.f.id, Url: optional(e.f.url), Events: config.SplitList(e.f.events), Description: optional(e.f.description)}
			var err error
			if req.Enabled, err = enabledFlag(e.f.enabled); err != nil {
				return err
			}
			res, err := s.Update(ctx, p, req)
			if err != nil {
				return err
			}
			return e.printOne(res.GetEndpoint())
		})},
		"webhook rotate-secret": {"--org ID --id ENDPOINT_ID   (prints the new secret, once; the old one also signs for 24 h)", []string{"org", "user", "id", "serve-webhook-egress"}, hookCmd(func(ctx context.Context, e *adminEnv, s *webhooks.Service, p *auth.Principal) error {
			res, err := s.Rotate(ctx, p, &cohortv1.RotateWebhookSecretRequest{Id: e.f.id})
			if err != nil {
				return err
			}
			return e.printOne(res)
		})},
		"webhook delete": {"--org ID --id ENDPOINT_ID", []string{"org", "user", "id", "serve-webhook-egress"}, hookCmd(func(ctx context.Context, e *adminEnv, s *webhooks.Service, p *auth.Principal) error {
			res, err := s.Delete(ctx, p, &cohortv1.DeleteWebhookEndpointRequest{Id: e.f.id})
			if err != nil {
				return err
			}
			return e.printOne(res)
		})},
		"webhook deliveries": {"--org ID --id ENDPOINT_ID [--status S] [--page-size N]   (the delivery log, newest first)", []string{"org", "user", "id", "status", "page-size", "serve-webhook-egress"}, hookCmd(func(ctx context.Context, e *adminEnv, s *webhooks.Service, p *auth.Principal) error {
			res, err := s.Deliveries(ctx, p, &cohortv1.ListWebhookDeliveriesRequest{EndpointId: e.f.id, Status: e.f.status, PageSize: int32(e.f.pageSize)})
			if err != nil {
				return err
			}
			return e.print(protos(res.GetDeliveries())...)
		})},
		"webhook redeliver": {"--org ID --id DELIVERY_ID   (a running gateway sends it again)", []string{"org", "user", "id", "serve-webhook-egress"}, hookCmd(func(ctx context.Context, e *adminEnv, s *webhooks.Service, p *auth.Principal) error {
			res, err := s.Redeliver(ctx, p, &cohortv1.RedeliverWebhookRequest{Id: e.f.id})
			if err != nil {
				return err
			}
			return e.printOne(res.GetDelivery())
		})},
	}
}

// enabledFlag reads --enabled.
func enabledFlag(f optString) (*bool, error) {
	if !f.set {
		return nil, nil
	}
	on, err := strconv.ParseBool(f.v)
	if err != nil {
		return nil, errors.New("--enabled: want true or false")
	}
	return &on, nil
}

// hookCmd gives a webhook command the service over the database (with
// the KEK, which wraps secrets, and --webhook-allow-hosts as serve's) and
// the operator principal.
func hookCmd(run func(context.Context, *adminEnv, *webhooks.Service, *auth.Principal) error) func(context.Context, *adminEnv) error {
	return func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		allow, err := safehttp.ParseAllowlist(e.cfg.Webhooks.AllowHosts)
		if err != nil {
			return fmt.Errorf("%s: %w", webhooks.AllowSetting, err)
		}
		kek, err := adminKEK(e)
		if err != nil {
			return err
		}
		return run(ctx, e, &webhooks.Service{DB: e.db, KEK: kek, Allow: allow}, p)
	}
}
