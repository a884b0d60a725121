package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/auth"
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

// fedFlagSet are the flags of the `cohort admin federation …` commands.
type fedFlagSet struct {
	issuerURL, jwksURL, subject, audience, condition, apiKey, enabled optString
	issuer, value, token, tokenFile, extraCAFile, allowHosts          string
	scopes, tokenType                                                 string
	limit                                                             int
}

// fedFlags declares the flags of these commands on fs, into e.
func fedFlags(fs *flag.FlagSet, e *adminEnv) {
	// Each invocation gets its own flag values (tests run the CLI in parallel).

	e.fed = &fedFlagSet{}
	f := e.fed
	fs.Var(&f.issuerURL, "issuer-url", "federation: issuer URL (https://, equal to the tokens' iss)")
	fs.Var(&f.jwksURL, "jwks-url", "federation: JWKS URL (empty: discovery)")
	fs.Var(&f.subject, "subject", "federation: the token sub a policy requires")
	fs.Var(&f.audience, "audience", "federation: the aud a policy requires")
	fs.Var(&f.condition, "condition", "federation: CEL condition over subject, audience, scopes, token_type")
	fs.Var(&f.apiKey, "api-key", "federation: id of the workspace API key a policy acts as")
	fs.Var(&f.enabled, "enabled", "federation: true or false (pause a policy)")
	fs.StringVar(&f.issuer, "issuer", "", "federation: issuer id")
	fs.StringVar(&f.value, "value", "", "federation: claim check value")
	fs.StringVar(&f.scopes, "scopes", "", "federation: claim check: the scopes claim must contain this")
	fs.StringVar(&f.tokenType, "token-type", "", "federation: claim check: the token_type claim must equal this")
	fs.StringVar(&f.token, "token", "", "federation: subject token for a dry run")
	fs.StringVar(&f.tokenFile, "token-file", "", "federation: file holding the subject token for a dry run")
	fs.StringVar(&f.extraCAFile, "extra-ca-file", env("COHORT_EXTRA_CA_FILE", ""), "federation: extra PEM roots for fetching identity provider keys")
	// As serve's: the CLI's fetches (dry-run) and save-time checks
	// (issuer-create) must see the egress policy serve enforces.
	fs.StringVar(&f.allowHosts, "federation-allow-hosts", env("COHORT_FEDERATION_ALLOW_HOSTS", ""), "federation: non-public identity provider hosts, addresses and ranges keys may be fetched from, as serve's setting (COHORT_FEDERATION_ALLOW_HOSTS)")
	fs.IntVar(&f.limit, "limit", 50, "federation: how many audit rows")
}

// fedCmds are these admin commands by name.
func fedCmds() map[string]adminCmd {
	return map[string]adminCmd{
		"federation issuer-create": {"--org ID --name N --issuer-url URL [--jwks-url URL] [--federation-allow-hosts H,…]", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			i, err := s.CreateIssuer(ctx, p, &cohortv1.CreateIssuerRequest{Name: e.f.name, IssuerUrl: e.fed.issuerURL.v, JwksUrl: e.fed.jwksURL.v})
			if err != nil {
				return err
			}
			return e.printOne(i)
		})},
		"federation issuer-list": {"--org ID", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			is, err := s.ListIssuers(ctx, p)
			if err != nil {
				return err
			}
			return e.print(protos(is)...)
		})},
		"federation issuer-get": {"--org ID --id ISSUER_ID", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			i, err := s.GetIssuer(ctx, p, e.f.id)
			if err != nil {
				return err
			}
			return e.printOne(i)
		})},
		"federation issuer-update": {"--org ID --id ISSUER_ID [--name N] [--issuer-url URL] [--jwks-url URL|\"\"]", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			i, err := s.UpdateIssuer(ctx, p, &cohortv1.UpdateIssuerRequest{Id: e.f.id, Name: optional(e.f.name),
				IssuerUrl: e.fed.issuerURL.ptr(), JwksUrl: e.fed.jwksURL.ptr()})
			if err != nil {
				return err
			}
			return e.printOne(i)
		})},
		"federation issuer-delete": {"--org ID --id ISSUER_ID   (deletes its policies too)", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			n, err := s.DeleteIssuer(ctx, p, e.f.id)
			if err != nil {
				return err
			}
			return e.printOne(&cohortv1.DeleteIssuerResponse{DeletedPolicies: int32(n)})
		})},
		"federation policy-create": {"--org ID --issuer ISSUER_ID --audience A --api-key KEY_ID [--subject S] [--condition CEL] [--enabled false] [--scopes V] [--token-type V]", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			req := &cohortv1.CreatePolicyRequest{IssuerId: e.fed.issuer, Subject: e.fed.subject.v, Audience: e.fed.audience.v,
				Condition: e.fed.condition.v, ApiKeyId: e.fed.apiKey.v}
			if e.fed.enabled.set {
				on, err := strconv.ParseBool(e.fed.enabled.v)
				if err != nil {
					return errors.New("--enabled: want true or false")
				}
				req.Enabled = &on
			}
			if e.fed.scopes != "" {
				req.ClaimChecks = append(req.ClaimChecks, &cohortv1.ClaimCheck{Kind: federation.CheckScopes, Value: e.fed.scopes})
			}
			if e.fed.tokenType != "" {
				req.ClaimChecks = append(req.ClaimChecks, &cohortv1.ClaimCheck{Kind: federation.CheckTokenType, Value: e.fed.tokenType})
			}
			pol, err := s.CreatePolicy(ctx, p, req)
			if err != nil {
				return err
			}
			return e.printOne(pol)
		})},
		"federation policy-list": {"--org ID [--issuer ISSUER_ID]", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			ps, err := s.ListPolicies(ctx, p, e.fed.issuer)
			if err != nil {
				return err
			}
			return e.print(protos(ps)...)
		})},
		"federation policy-get": {"--org ID --id POLICY_ID", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			pol, err := s.GetPolicy(ctx, p, e.f.id)
			if err != nil {
				return err
			}
			return e.printOne(pol)
		})},
		"federation policy-update": {"--org ID --id POLICY_ID [--subject S] [--audience A] [--condition CEL] [--api-key KEY_ID] [--enabled true|false]", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			req := &cohortv1.UpdatePolicyRequest{Id: e.f.id, Subject: e.fed.subject.ptr(), Audience: e.fed.audience.ptr(),
				Condition: e.fed.condition.ptr(), ApiKeyId: e.fed.apiKey.ptr()}
			if e.fed.enabled.set {
				on, err := strconv.ParseBool(e.fed.enabled.v)
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
		"federation policy-delete": {"--org ID --id POLICY_ID", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			if err := s.DeletePolicy(ctx, p, e.f.id); err != nil {
				return err
			}
			return e.printOne(&cohortv1.DeletePolicyResponse{})
		})},
		"federation claim-set": {"--org ID --id POLICY_ID --kind scopes|token_type --value V", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			pol, err := s.SetClaimCheck(ctx, p, e.f.id, &cohortv1.ClaimCheck{Kind: e.f.kind, Value: e.fed.value})
			if err != nil {
				return err
			}
			return e.printOne(pol)
		})},
		"federation claim-remove": {"--org ID --id POLICY_ID --kind scopes|token_type", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			pol, err := s.RemoveClaimCheck(ctx, p, e.f.id, e.f.kind)
			if err != nil {
				return err
			}
			return e.printOne(pol)
		})},
		"federation condition-validate": {"--org ID --condition CEL", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			res, err := s.ValidateCondition(ctx, p, e.fed.condition.v)
			if err != nil {
				return err
			}
			return e.printOne(res)
		})},
		"federation dry-run": {"--org ID --id POLICY_ID (--token JWT | --token-file F) [--extra-ca-file F] [--federation-allow-hosts H,…]", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			tok := e.fed.token
			if e.fed.tokenFile != "" {
				b, err := os.ReadFile(e.fed.tokenFile)
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
		"federation exchanges": {"--org ID [--id POLICY_ID] [--limit N]   (the exchange audit, newest first)", fedCmd(func(ctx context.Context, e *adminEnv, s *federation.Service, p *auth.Principal) error {
			res, err := s.ListExchanges(ctx, p, &cohortv1.ListExchangesRequest{PolicyId: e.f.id, PageSize: int32(e.fed.limit)})
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
		roots, err := safehttp.ExtraRootsFromFile(e.fed.extraCAFile)
		if err != nil {
			return err
		}
		allow, err := safehttp.ParseAllowlist(splitList(e.fed.allowHosts))
		if err != nil {
			return fmt.Errorf("--federation-allow-hosts (COHORT_FEDERATION_ALLOW_HOSTS): %w", err)
		}
		s := federation.New(e.db, nil, nil)
		s.Config.HTTPClient = safehttp.New(safehttp.Options{ExtraRoots: roots, Allow: allow})
		defer s.Close()
		return run(ctx, e, s, p)
	}
}
