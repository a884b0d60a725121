package federation

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"google.golang.org/protobuf/types/known/timestamppb"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/store"
)

// Bounds of the settings the spec leaves open (ADR 0012).
const (
	MaxIssuerName   = 100
	MaxURL          = 1024
	MaxPolicyString = 512 // subject, audience, claim check values: the token's own bounds
)

// Claim check kinds.
const (
	CheckScopes    = "scopes"
	CheckTokenType = "token_type"
)

// checkHTTPSURL validates an issuer or JWKS URL: https, a host, no
// credentials, no fragment; an issuer also no query (OpenID Connect
// Core §2). The text is kept exactly as given: the issuer URL must equal
// the tokens' iss byte for byte, so it is never normalised.
func checkHTTPSURL(field, raw string, issuer bool) error {
	if raw == "" {
		return apierr.BadRequest("%s is required", field)
	}
	if len(raw) > MaxURL {
		return apierr.BadRequest("%s must be at most %d bytes", field, MaxURL)
	}
	for _, r := range raw {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return apierr.BadRequest("%s must not contain spaces or control characters", field)
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return apierr.BadRequest("%s is not a URL", field)
	}
	switch {
	case u.Scheme != "https":
		return apierr.BadRequest("%s must start with https://", field)
	case u.Host == "" || u.Hostname() == "":
		return apierr.BadRequest("%s must name a host", field)
	case u.User != nil:
		return apierr.BadRequest("%s must not carry credentials", field)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return apierr.BadRequest("%s must not have a fragment", field)
	case issuer && (u.RawQuery != "" || strings.Contains(raw, "?")):
		return apierr.BadRequest("%s must not have a query", field)
	}
	return nil
}

func checkName(v string) error {
	if strings.TrimSpace(v) == "" {
		return apierr.BadRequest("name is required")
	}
	if utf8.RuneCountInString(v) > MaxIssuerName {
		return apierr.BadRequest("name must be at most %d characters", MaxIssuerName)
	}
	return nil
}

// IssuerProto converts a row.
func IssuerProto(i *store.FederationIssuer) *cohortv1.FederationIssuer {
	out := &cohortv1.FederationIssuer{Id: i.ID, Name: i.Name, IssuerUrl: i.IssuerURL, JwksUrl: i.JWKSURL, CreatedAt: timestamppb.New(i.CreatedAt)}
	if i.UpdatedAt != nil {
		out.UpdatedAt = timestamppb.New(*i.UpdatedAt)
	}
	return out
}

// PolicyProto converts a row.
func PolicyProto(p *store.FederationPolicy) *cohortv1.FederationPolicy {
	out := &cohortv1.FederationPolicy{Id: p.ID, IssuerId: p.IssuerID, Subject: p.Subject, Audience: p.Audience,
		Condition: p.Condition, ApiKeyId: p.APIKeyID, Enabled: p.Enabled, CreatedAt: timestamppb.New(p.CreatedAt)}
	if p.ScopesCheck != nil {
		out.ClaimChecks = append(out.ClaimChecks, &cohortv1.ClaimCheck{Kind: CheckScopes, Value: *p.ScopesCheck})
	}
	if p.TokenTypeCheck != nil {
		out.ClaimChecks = append(out.ClaimChecks, &cohortv1.ClaimCheck{Kind: CheckTokenType, Value: *p.TokenTypeCheck})
	}
	if p.UpdatedAt != nil {
		out.UpdatedAt = timestamppb.New(*p.UpdatedAt)
	}
	return out
}

func wrap(err error) error {
	var e *apierr.Error
	if errors.As(err, &e) {
		return e
	}
	return apierr.Internal(err)
}

// checkReachable refuses an issuer whose keys the egress policy would
// never let the service fetch: the URL fetched first (the JWKS URL when
// set, else the issuer URL for discovery) resolving only to addresses the
// guarded client refuses. Saving it silently would only move the failure
// to every exchange. The check is the client's own (safehttp.CheckURL),
// so it cannot drift from what the dial enforces.
func (s *Service) checkReachable(ctx context.Context, i *store.FederationIssuer) error {
	field, u := "issuer_url", i.IssuerURL
	if i.JWKSURL != "" {
		field, u = "jwks_url", i.JWKSURL
	}
	cfg := s.settings()
	rctx, cancel := context.WithTimeout(ctx, cfg.FetchTimeout)
	defer cancel()
	if err := safehttp.CheckURL(rctx, cfg.HTTPClient, u); err != nil {
		// Which address the host resolved to is not said: a tenant's
		// admin should not learn the service's internal DNS from it.
		return apierr.BadRequest("%s: the egress policy refuses this identity provider: its host resolves only to "+
			"non-public addresses (loopback, private, link-local), which keys are never fetched from unless an operator "+
			"lists the host or its range in %s", field, config.Setting("federation-allow-hosts"))
	}
	return nil
}

// CreateIssuer adds an identity provider the organization trusts.
func (s *Service) CreateIssuer(ctx context.Context, p *auth.Principal, req *cohortv1.CreateIssuerRequest) (*cohortv1.FederationIssuer, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	if err := checkName(req.GetName()); err != nil {
		return nil, err
	}
	if err := checkHTTPSURL("issuer_url", req.GetIssuerUrl(), true); err != nil {
		return nil, err
	}
	if req.GetJwksUrl() != "" {
		if err := checkHTTPSURL("jwks_url", req.GetJwksUrl(), false); err != nil {
			return nil, err
		}
	}
	i := &store.FederationIssuer{ID: uuid.NewString(), OrganizationID: p.OrganizationID, Name: req.GetName(),
		IssuerURL: req.GetIssuerUrl(), JWKSURL: req.GetJwksUrl(), Revision: 1, CreatedAt: s.now()}
	if err := s.checkReachable(ctx, i); err != nil {
		return nil, err
	}
	if _, err := s.DB.NewInsert().Model(i).Exec(ctx); err != nil {
		if store.IsUniqueViolation(err) {
			return nil, apierr.Conflict(apierr.ReasonConflict, "an issuer with issuer_url %q already exists in this organization", i.IssuerURL)
		}
		return nil, apierr.Internal(err)
	}
	return IssuerProto(i), nil
}

func (s *Service) loadIssuer(ctx context.Context, db bun.IDB, orgID, id string) (*store.FederationIssuer, error) {
	var i store.FederationIssuer
	err := db.NewSelect().Model(&i).Where("id = ? AND organization_id = ?", id, orgID).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, apierr.NotFound("issuer %q not found", truncate(id, 64))
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return &i, nil
}

// GetIssuer returns one issuer of the caller's organization.
func (s *Service) GetIssuer(ctx context.Context, p *auth.Principal, id string) (*cohortv1.FederationIssuer, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	i, err := s.loadIssuer(ctx, s.DB, p.OrganizationID, id)
	if err != nil {
		return nil, err
	}
	return IssuerProto(i), nil
}

// ListIssuers lists the organization's issuers.
func (s *Service) ListIssuers(ctx context.Context, p *auth.Principal) ([]*cohortv1.FederationIssuer, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	var rows []store.FederationIssuer
	if err := s.DB.NewSelect().Model(&rows).Where("organization_id = ?", p.OrganizationID).Order("created_at", "id").Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	out := make([]*cohortv1.FederationIssuer, len(rows))
	for i := range rows {
		out[i] = IssuerProto(&rows[i])
	}
	return out, nil
}

// UpdateIssuer changes the fields set in req. The revision grows, so every
// replica rebuilds the issuer's key store on its next exchange.
func (s *Service) UpdateIssuer(ctx context.Context, p *auth.Principal, req *cohortv1.UpdateIssuerRequest) (*cohortv1.FederationIssuer, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	i, err := s.loadIssuer(ctx, s.DB, p.OrganizationID, req.GetId())
	if err != nil {
		return nil, err
	}
	if req.Name != nil {
		if err := checkName(req.GetName()); err != nil {
			return nil, err
		}
		i.Name = req.GetName()
	}
	if req.IssuerUrl != nil {
		if err := checkHTTPSURL("issuer_url", req.GetIssuerUrl(), true); err != nil {
			return nil, err
		}
		i.IssuerURL = req.GetIssuerUrl()
	}
	if req.JwksUrl != nil {
		if req.GetJwksUrl() != "" {
			if err := checkHTTPSURL("jwks_url", req.GetJwksUrl(), false); err != nil {
				return nil, err
			}
		}
		i.JWKSURL = req.GetJwksUrl()
	}
	if req.IssuerUrl != nil || req.JwksUrl != nil {
		if err := s.checkReachable(ctx, i); err != nil {
			return nil, err
		}
	}
	now := s.now()
	i.UpdatedAt = &now
	i.Revision++
	_, err = s.DB.NewUpdate().Model((*store.FederationIssuer)(nil)).
		Set("name = ?", i.Name).Set("issuer_url = ?", i.IssuerURL).Set("jwks_url = ?", i.JWKSURL).
		Set("updated_at = ?", now).Set("revision = revision + 1").
		Where("id = ? AND organization_id = ?", i.ID, p.OrganizationID).Exec(ctx)
	if err != nil {
		if store.IsUniqueViolation(err) {
			return nil, apierr.Conflict(apierr.ReasonConflict, "an issuer with issuer_url %q already exists in this organization", i.IssuerURL)
		}
		return nil, apierr.Internal(err)
	}
	s.stores.drop(i.ID)
	return IssuerProto(i), nil
}

// DeleteIssuer deletes the issuer and its policies in one transaction: new
// exchanges through them fail at once.
func (s *Service) DeleteIssuer(ctx context.Context, p *auth.Principal, id string) (int, error) {
	if err := requireAdmin(p); err != nil {
		return 0, err
	}
	var n int64
	err := s.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if _, err := s.loadIssuer(ctx, tx, p.OrganizationID, id); err != nil {
			return err
		}
		res, err := tx.NewDelete().Model((*store.FederationPolicy)(nil)).Where("issuer_id = ? AND organization_id = ?", id, p.OrganizationID).Exec(ctx)
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		_, err = tx.NewDelete().Model((*store.FederationIssuer)(nil)).Where("id = ? AND organization_id = ?", id, p.OrganizationID).Exec(ctx)
		return err
	})
	if err != nil {
		return 0, wrap(err)
	}
	s.stores.drop(id)
	return int(n), nil
}

// checkClaimCheck validates one claim check.
func checkClaimCheck(c *cohortv1.ClaimCheck) error {
	switch c.GetKind() {
	case CheckScopes, CheckTokenType:
	default:
		return apierr.BadRequest("claim check kind must be scopes or token_type, not %q", truncate(c.GetKind(), 64))
	}
	if c.GetValue() == "" {
		return apierr.BadRequest("claim check %s needs a value", c.GetKind())
	}
	if utf8.RuneCountInString(c.GetValue()) > MaxPolicyString {
		return apierr.BadRequest("claim check %s value must be at most %d characters", c.GetKind(), MaxPolicyString)
	}
	return nil
}

// validatePolicy checks a policy as a whole, as it would be saved.
func (s *Service) validatePolicy(ctx context.Context, db bun.IDB, orgID string, pol *store.FederationPolicy) error {
	if utf8.RuneCountInString(pol.Subject) > MaxPolicyString {
		return apierr.BadRequest("subject must be at most %d characters (longer subjects are refused in tokens)", MaxPolicyString)
	}
	if pol.Audience == "" {
		return apierr.BadRequest("audience is required")
	}
	if utf8.RuneCountInString(pol.Audience) > MaxPolicyString {
		return apierr.BadRequest("audience must be at most %d characters (longer values are refused in tokens)", MaxPolicyString)
	}
	if pol.Subject == "" && pol.Condition == "" {
		return apierr.BadRequest("a policy must set a subject, a condition, or both")
	}
	if pol.Condition != "" {
		if err := CheckCondition(pol.Condition); err != nil {
			return err
		}
	}
	if _, err := s.loadIssuer(ctx, db, orgID, pol.IssuerID); err != nil {
		return err
	}
	if pol.APIKeyID == "" {
		return apierr.BadRequest("api_key_id is required: the workspace API key the policy acts as")
	}
	var k store.APIKey
	err := db.NewSelect().Model(&k).Where("id = ? AND organization_id = ? AND deleted_at IS NULL", pol.APIKeyID, orgID).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return apierr.NotFound("API key %q not found", truncate(pol.APIKeyID, 64))
	}
	if err != nil {
		return apierr.Internal(err)
	}
	if k.Kind != store.KeyWorkspace {
		return apierr.BadRequest("a policy must act as a workspace API key; %s keys cannot be targeted", k.Kind)
	}
	return nil
}

// CreatePolicy adds a policy. It is validated as a whole: at least a
// subject or a condition; the condition compiled against the four
// variables; the target a workspace key of this organization.
func (s *Service) CreatePolicy(ctx context.Context, p *auth.Principal, req *cohortv1.CreatePolicyRequest) (*cohortv1.FederationPolicy, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	pol := &store.FederationPolicy{ID: uuid.NewString(), OrganizationID: p.OrganizationID, IssuerID: req.GetIssuerId(),
		Subject: req.GetSubject(), Audience: req.GetAudience(), Condition: req.GetCondition(), APIKeyID: req.GetApiKeyId(),
		Enabled: req.Enabled == nil || req.GetEnabled(), CreatedAt: s.now()}
	seen := map[string]bool{}
	for _, c := range req.GetClaimChecks() {
		if err := checkClaimCheck(c); err != nil {
			return nil, err
		}
		if seen[c.GetKind()] {
			return nil, apierr.BadRequest("claim check %s is given twice: each kind may be added once", c.GetKind())
		}
		seen[c.GetKind()] = true
		v := c.GetValue()
		if c.GetKind() == CheckScopes {
			pol.ScopesCheck = &v
		} else {
			pol.TokenTypeCheck = &v
		}
	}
	if err := s.validatePolicy(ctx, s.DB, p.OrganizationID, pol); err != nil {
		return nil, err
	}
	if _, err := s.DB.NewInsert().Model(pol).Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return PolicyProto(pol), nil
}

func (s *Service) loadPolicy(ctx context.Context, db bun.IDB, orgID, id string) (*store.FederationPolicy, error) {
	var pol store.FederationPolicy
	err := db.NewSelect().Model(&pol).Where("id = ? AND organization_id = ?", id, orgID).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, apierr.NotFound("policy %q not found", truncate(id, 64))
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return &pol, nil
}

// GetPolicy returns one policy of the caller's organization.
func (s *Service) GetPolicy(ctx context.Context, p *auth.Principal, id string) (*cohortv1.FederationPolicy, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	pol, err := s.loadPolicy(ctx, s.DB, p.OrganizationID, id)
	if err != nil {
		return nil, err
	}
	return PolicyProto(pol), nil
}

// ListPolicies lists the organization's policies, optionally of one issuer.
func (s *Service) ListPolicies(ctx context.Context, p *auth.Principal, issuerID string) ([]*cohortv1.FederationPolicy, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	var rows []store.FederationPolicy
	q := s.DB.NewSelect().Model(&rows).Where("organization_id = ?", p.OrganizationID).Order("created_at", "id")
	if issuerID != "" {
		q = q.Where("issuer_id = ?", issuerID)
	}
	if err := q.Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	out := make([]*cohortv1.FederationPolicy, len(rows))
	for i := range rows {
		out[i] = PolicyProto(&rows[i])
	}
	return out, nil
}

// updatePolicy loads a policy, applies change, validates the result and
// saves it, in one transaction.
func (s *Service) updatePolicy(ctx context.Context, p *auth.Principal, id string, change func(*store.FederationPolicy) error) (*cohortv1.FederationPolicy, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	var out *store.FederationPolicy
	err := s.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		pol, err := s.loadPolicy(ctx, tx, p.OrganizationID, id)
		if err != nil {
			return err
		}
		if err := change(pol); err != nil {
			return err
		}
		if err := s.validatePolicy(ctx, tx, p.OrganizationID, pol); err != nil {
			return err
		}
		now := s.now()
		pol.UpdatedAt = &now
		if _, err := tx.NewUpdate().Model(pol).WherePK().Exec(ctx); err != nil {
			return err
		}
		out = pol
		return nil
	})
	if err != nil {
		return nil, wrap(err)
	}
	return PolicyProto(out), nil
}

// UpdatePolicy changes the fields set in req. Turning enabled off pauses
// the policy: the next exchange is refused.
func (s *Service) UpdatePolicy(ctx context.Context, p *auth.Principal, req *cohortv1.UpdatePolicyRequest) (*cohortv1.FederationPolicy, error) {
	return s.updatePolicy(ctx, p, req.GetId(), func(pol *store.FederationPolicy) error {
		if req.Subject != nil {
			pol.Subject = req.GetSubject()
		}
		if req.Audience != nil {
			pol.Audience = req.GetAudience()
		}
		if req.Condition != nil {
			pol.Condition = req.GetCondition()
		}
		if req.ApiKeyId != nil {
			pol.APIKeyID = req.GetApiKeyId()
		}
		if req.Enabled != nil {
			pol.Enabled = req.GetEnabled()
		}
		return nil
	})
}

// SetClaimCheck adds the check of a kind or replaces its value.
func (s *Service) SetClaimCheck(ctx context.Context, p *auth.Principal, policyID string, c *cohortv1.ClaimCheck) (*cohortv1.FederationPolicy, error) {
	if err := checkClaimCheck(c); err != nil {
		return nil, err
	}
	return s.updatePolicy(ctx, p, policyID, func(pol *store.FederationPolicy) error {
		v := c.GetValue()
		if c.GetKind() == CheckScopes {
			pol.ScopesCheck = &v
		} else {
			pol.TokenTypeCheck = &v
		}
		return nil
	})
}

// RemoveClaimCheck removes the check of one kind; the other stays.
func (s *Service) RemoveClaimCheck(ctx context.Context, p *auth.Principal, policyID, kind string) (*cohortv1.FederationPolicy, error) {
	if kind != CheckScopes && kind != CheckTokenType {
		return nil, apierr.BadRequest("claim check kind must be scopes or token_type, not %q", truncate(kind, 64))
	}
	return s.updatePolicy(ctx, p, policyID, func(pol *store.FederationPolicy) error {
		field := &pol.ScopesCheck
		if kind == CheckTokenType {
			field = &pol.TokenTypeCheck
		}
		if *field == nil {
			return apierr.NotFound("policy has no %s claim check", kind)
		}
		*field = nil
		return nil
	})
}

// DeletePolicy deletes a policy; the next exchange naming it is refused.
func (s *Service) DeletePolicy(ctx context.Context, p *auth.Principal, id string) error {
	if err := requireAdmin(p); err != nil {
		return err
	}
	res, err := s.DB.NewDelete().Model((*store.FederationPolicy)(nil)).Where("id = ? AND organization_id = ?", id, p.OrganizationID).Exec(ctx)
	if err != nil {
		return apierr.Internal(err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return apierr.NotFound("policy %q not found", truncate(id, 64))
	}
	return nil
}

// ValidateCondition runs the save-time checks of a condition. A condition
// that breaks a rule is not an error of the call: valid is false and the
// message names the rule.
func (s *Service) ValidateCondition(ctx context.Context, p *auth.Principal, expr string) (*cohortv1.ValidateConditionResponse, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	if err := CheckCondition(expr); err != nil {
		e := apierr.From(err)
		if e.Status != 400 {
			return nil, err
		}
		return &cohortv1.ValidateConditionResponse{Valid: false, Message: e.Message}, nil
	}
	return &cohortv1.ValidateConditionResponse{Valid: true}, nil
}
