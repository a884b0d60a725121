package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/federation"
	"github.com/cohort-dev/cohort/internal/safehttp"
)

// optString is a flag that remembers whether it was given, so an update
// can tell "set to empty" from "leave alone".
type optString struct {
	v   string
	set bool
}

func (o *optString) String() string { return o.v }
func (o *optString) Set(v string) error {
	o.v, o.set = v, true
	return nil
}

func (o *optString) ptr() *string {
	if !o.set {
		return nil
	}
	v := o.v
	return &v
}

// fedCmds are these admin commands by name.
func fedCmds() map[string]adminCmd {
	return map[string]adminCmd{
		"federation issuer-create": {"--org ID --name N --issuer-url URL [--jwks-url URL] [--federation-allow-hosts H,…]", []string{"org", "user", "name", "issuer-url", "jwks-url", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			i, err := s.CreateIssuer(ctx, p, &cohortv1.CreateIssuerRequest{Name: e.f.name, IssuerUrl: e.f.issuerURL.v, JwksUrl: e.f.jwksURL.v})
			if err != nil {
				return err
			}
			return e.printOne(i)
		})},
		"federation issuer-list": {"--org ID", []string{"org", "user", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			is, err := s.ListIssuers(ctx, p)
			if err != nil {
				return err
			}
			return e.print(protos(is)...)
		})},
		"federation issuer-get": {"--org ID --id ISSUER_ID", []string{"org", "user", "id", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			i, err := s.GetIssuer(ctx, p, e.f.id)
			if err != nil {
				return err
			}
			return e.printOne(i)
		})},
		"federation issuer-update": {"--org ID --id ISSUER_ID [--name N] [--issuer-url URL] [--jwks-url URL|\"\"]", []string{"org", "user", "id", "name", "issuer-url", "jwks-url", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			i, err := s.UpdateIssuer(ctx, p, &cohortv1.UpdateIssuerRequest{Id: e.f.id, Name: optional(e.f.name),
				IssuerUrl: e.f.issuerURL.ptr(), JwksUrl: e.f.jwksURL.ptr()})
			if err != nil {
				return err
			}
			return e.printOne(i)
		})},
		"federation issuer-delete": {"--org ID --id ISSUER_ID   (deletes its policies too)", []string{"org", "user", "id", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			n, err := s.DeleteIssuer(ctx, p, e.f.id)
			if err != nil {
				return err
			}
			return e.printOne(&cohortv1.DeleteIssuerResponse{DeletedPolicies: int32(n)})
		})},
		"federation policy-create": {"--org ID --issuer ISSUER_ID --audience A --api-key KEY_ID [--subject S] [--condition CEL] [--enabled false] [--scopes V] [--token-type V]", []string{"org", "user", "issuer", "audience", "api-key", "subject", "condition", "enabled", "scopes", "token-type", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			req := &cohortv1.CreatePolicyRequest{IssuerId: e.f.issuer, Subject: e.f.subject.v, Audience: e.f.audience.v,
				Condition: e.f.condition.v, ApiKeyId: e.f.apiKey.v}
			if e.f.enabled.set {
				on, err := strconv.ParseBool(e.f.enabled.v)
				if err != nil {
					return errors.New("--enabled: want true or false")
				}
				req.Enabled = &on
			}
			if e.f.scopes != "" {
				req.ClaimChecks = append(req.ClaimChecks, &cohortv1.ClaimCheck{Kind: federation.CheckScopes, Value: e.f.scopes})
			}
			if e.f.tokenType != "" {
				req.ClaimChecks = append(req.ClaimChecks, &cohortv1.ClaimCheck{Kind: federation.CheckTokenType, Value: e.f.tokenType})
			}
			pol, err := s.CreatePolicy(ctx, p, req)
			if err != nil {
				return err
			}
			return e.printOne(pol)
		})},
		"federation policy-list": {"--org ID [--issuer ISSUER_ID]", []string{"org", "user", "issuer", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			ps, err := s.ListPolicies(ctx, p, e.f.issuer)
			if err != nil {
				return err
			}
			return e.print(protos(ps)...)
		})},
		"federation policy-get": {"--org ID --id POLICY_ID", []string{"org", "user", "id", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			pol, err := s.GetPolicy(ctx, p, e.f.id)
			if err != nil {
				return err
			}
			return e.printOne(pol)
		})},
		"federation policy-update": {"--org ID --id POLICY_ID [--subject S] [--audience A] [--condition CEL] [--api-key KEY_ID] [--enabled true|false]", []string{"org", "user", "id", "subject", "audience", "condition", "api-key", "enabled", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			req := &cohortv1.UpdatePolicyRequest{Id: e.f.id, Subject: e.f.subject.ptr(), Audience: e.f.audience.ptr(),
				Condition: e.f.condition.ptr(), ApiKeyId: e.f.apiKey.ptr()}
			if e.f.enabled.set {
				on, err := strconv.ParseBool(e.f.enabled.v)
				if err != nil {
					return errors.New("--enabled: want true or false")
				}
				req.Enabled = &on
			}
			pol, err := s.UpdatePolicy(ctx, p, req)
			if err != nil {
				return err
			}
			return e.printOne(pol)
		})},
		"federation policy-delete": {"--org ID --id POLICY_ID", []string{"org", "user", "id", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			if err := s.DeletePolicy(ctx, p, e.f.id); err != nil {
				return err
			}
			return e.printOne(&cohortv1.DeletePolicyResponse{})
		})},
		"federation claim-set": {"--org ID --id POLICY_ID --kind scopes|token_type --value V", []string{"org", "user", "id", "kind", "value", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			pol, err := s.SetClaimCheck(ctx, p, e.f.id, &cohortv1.ClaimCheck{Kind: e.f.kind, Value: e.f.value})
			if err != nil {
				return err
			}
			return e.printOne(pol)
		})},
		"federation claim-remove": {"--org ID --id POLICY_ID --kind scopes|token_type", []string{"org", "user", "id", "kind", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			pol, err := s.RemoveClaimCheck(ctx, p, e.f.id, e.f.kind)
			if err != nil {
				return err
			}
			return e.printOne(pol)
		})},
		"federation condition-validate": {"--org ID --condition CEL", []string{"org", "user", "condition", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			res, err := s.ValidateCondition(ctx, p, e.f.condition.v)
			if err != nil {
				return err
			}
			return e.printOne(res)
		})},
		"federation dry-run": {"--org ID --id POLICY_ID (--token JWT | --token-file F) [--extra-ca-file F] [--federation-allow-hosts H,…]", []string{"org", "user", "id", "token", "token-file", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			tok := e.f.token
			if e.f.tokenFile != "" {
				b, err := os.ReadFile(e.f.tokenFile)
				if err != nil {
					return err
				}
				tok = strings.TrimSpace(string(b))
			}
			res, err := s.DryRun(ctx, p, e.f.id, tok)
			if err != nil {
				return err
			}
			return e.printOne(res)
		})},
		"federation exchanges": {"--org ID [--id POLICY_ID] [--limit N]   (the exchange audit, newest first)", []string{"org", "user", "id", "limit", "serve-federation-egress"}, fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			res, err := s.ListExchanges(ctx, p, &cohortv1.ListExchangesRequest{PolicyId: e.f.id, PageSize: int32(e.f.limit)})
			if err != nil {
				return err
			}
			return e.print(protos(res.GetExchanges())...)
		})},
	}
}

// fedCmd gives a federation command the service over the database (with
// the guarded client, trusting --extra-ca-file and reaching what
// --federation-allow-hosts lists, as serve's does) and the operator
// principal.
func fedCmd(run func(context.Context, *adminEnv, *federation.Service, *auth.Principal) error) func(context.Context, *adminEnv) error {
	return func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		roots, err := safehttp.ExtraRootsFromFile(e.cfg.Federation.ExtraCAFile)
		if err != nil {
			return err
		}
		allow, err := safehttp.ParseAllowlist(e.cfg.Federation.AllowHosts)
		if err != nil {
			return fmt.Errorf("%s: %w", config.Setting("federation-allow-hosts"), err)
		}
		s := federation.New(e.db, nil, nil)
		s.Config.HTTPClient = safehttp.New(safehttp.Options{ExtraRoots: roots, Allow: allow})
		defer s.Close()
		return run(ctx, e, s, p)
	}
}
