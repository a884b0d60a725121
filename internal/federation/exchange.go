package federation

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/store"
)

// The checks of an exchange, in the order they run. The audit and the dry
// run name a failure by these.
const (
	checkTokenFormat = "token_format"
	checkPolicy      = "policy"
	checkEntitlement = "entitlement"
	checkEnabled     = "policy_enabled"
	checkLimits      = "token_limits"
	checkAlgorithm   = "algorithm"
	checkIssuerKeys  = "issuer_keys"
	checkSignature   = "signature"
	checkExpiry      = "expiry"
	checkIssuer      = "issuer"
	checkAudience    = "audience"
	checkSubject     = "subject"
	checkScopesClaim = "claim_scopes"
	checkTypeClaim   = "claim_token_type"
	checkCondition   = "condition"
	checkAPIKey      = "api_key"
)

var checkOrder = []string{checkTokenFormat, checkPolicy, checkEntitlement, checkEnabled, checkLimits, checkAlgorithm,
	checkIssuerKeys, checkSignature, checkExpiry, checkIssuer, checkAudience, checkSubject, checkScopesClaim,
	checkTypeClaim, checkCondition, checkAPIKey}

// policyRow is everything an exchange needs. A paused or deleted policy, a
// deleted issuer, a lost entitlement or a disabled key stops the very next
// exchange, on every replica: the exchange reads the row on every call, or
// keeps it in memory and reads its Version on every call (policyCache).
type policyRow struct {
	ID, OrganizationID, IssuerID string
	Subject, Audience, Condition string
	APIKeyID                     string
	Enabled                      bool
	ScopesCheck, TokenTypeCheck  *string
	IssuerURL, JWKSURL           string
	Revision                     int64
	WorkloadIdentity             bool
	KeyKind                      string
	KeyDisabled, KeyDeleted      bool
	// Version changes, in the same transaction, with any of the above
	// (triggers: internal/store's federation_policy_version migration).
	Version int64
}

// policyQuery has the dialect's placeholders for the policy id and,
// optionally, the organization. It is a prepared statement: SQLite would
// otherwise parse and plan the join on every exchange, which costs more
// than the exchange's signature check (docs/benchmarks.md).
func policyQuery(db bun.IDB, withOrg bool) string {
	q := `SELECT p.id, p.organization_id, p.issuer_id, p.subject, p.audience, p.condition_expr,
	p.api_key_id, p.enabled, p.scopes_check, p.token_type_check,
	i.issuer_url, i.jwks_url, i.revision, o.workload_identity,
	k.kind AS key_kind, k.disabled_at IS NOT NULL AS key_disabled, k.deleted_at IS NOT NULL AS key_deleted,
	p.version
FROM federation_policies p
JOIN federation_issuers i ON i.id = p.issuer_id
JOIN organizations o ON o.id = p.organization_id
JOIN api_keys k ON k.id = p.api_key_id
WHERE p.id = ` + store.Placeholder(db, 1)
	if withOrg {
		q += " AND p.organization_id = " + store.Placeholder(db, 2)
	}
	return q
}

// policyVersionQuery reads a policy's version alone.
func policyVersionQuery(db bun.IDB) string {
	return "SELECT version FROM federation_policies WHERE id = " + store.Placeholder(db, 1)
}

// preparedStmt prepares a statement once, on first use.
type preparedStmt struct {
	once sync.Once
	stmt *sql.Stmt
	err  error
}

func (p *preparedStmt) get(ctx context.Context, db *sql.DB, query string) (*sql.Stmt, error) {
	p.once.Do(func() { p.stmt, p.err = db.PrepareContext(context.WithoutCancel(ctx), query) })
	return p.stmt, p.err
}

// reads is where the exchange's lookups run: the read pool when there is
// one (SQLite), else the database's own pool.
func (s *Service) reads() *sql.DB {
	if s.Reads != nil {
		return s.Reads
	}
	return s.DB.DB
}

// loadPolicyRow returns the policy (of orgID when it is set), or nil when
// there is none.
func (s *Service) loadPolicyRow(ctx context.Context, id, orgID string) (*policyRow, error) {
	var stmt *sql.Stmt
	var err error
	args := []any{id}
	if orgID == "" {
		stmt, err = s.policyStmt.get(ctx, s.reads(), policyQuery(s.DB, false))
	} else {
		stmt, err = s.policyOrgStmt.get(ctx, s.reads(), policyQuery(s.DB, true))
		args = append(args, orgID)
	}
	if err != nil {
		return nil, err
	}
	rows, err := stmt.QueryContext(ctx, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if !rows.Next() {
		return nil, rows.Err()
	}
	var r policyRow
	if err := rows.Scan(&r.ID, &r.OrganizationID, &r.IssuerID, &r.Subject, &r.Audience, &r.Condition,
		&r.APIKeyID, &r.Enabled, &r.ScopesCheck, &r.TokenTypeCheck, &r.IssuerURL, &r.JWKSURL, &r.Revision,
		&r.WorkloadIdentity, &r.KeyKind, &r.KeyDisabled, &r.KeyDeleted, &r.Version); err != nil {
		return nil, err
	}
	return &r, rows.Close()
}

// policyCache keeps the policies exchanges name, each with the version it
// was read at. An exchange reads the version (one column of one row by
// its key) instead of the policy: on SQLite that is about a third of the
// cost of the four-table join's 18 columns, most of which goes to the
// columns, not the join (docs/benchmarks.md). The version lives in the
// database and changes with every input of the row in the writer's own
// transaction, so an unchanged version means an unchanged row, whichever
// replica or tool wrote last; a policy deleted meanwhile has no version.
type policyCache struct {
	mu sync.RWMutex
	m  map[string]*policyRow
}

// maxCachedPolicies bounds the cache; when full it starts over.
const maxCachedPolicies = 4096

func (c *policyCache) get(id string) *policyRow {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[id]
}

func (c *policyCache) put(id string, r *policyRow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r == nil {
		delete(c.m, id)
		return
	}
	if c.m == nil || len(c.m) >= maxCachedPolicies {
		c.m = map[string]*policyRow{}
	}
	c.m[id] = r
}

// exchangePolicy returns the policy an exchange names, or nil when there
// is none: the cached row when its version is still the database's, else
// the row read again.
func (s *Service) exchangePolicy(ctx context.Context, id string) (*policyRow, error) {
	if cached := s.policies.get(id); cached != nil {
		stmt, err := s.policyVersionStmt.get(ctx, s.reads(), policyVersionQuery(s.DB))
		if err != nil {
			return nil, err
		}
		var version int64
		switch err := stmt.QueryRowContext(ctx, id).Scan(&version); {
		case errors.Is(err, sql.ErrNoRows):
			s.policies.put(id, nil)
			return nil, nil
		case err != nil:
			return nil, err
		case version == cached.Version:
			return cached, nil
		}
	}
	r, err := s.loadPolicyRow(ctx, id, "")
	if err != nil {
		return nil, err
	}
	s.policies.put(id, r)
	return r, nil
}

func (r *policyRow) issuer() *store.FederationIssuer {
	return &store.FederationIssuer{ID: r.IssuerID, OrganizationID: r.OrganizationID, IssuerURL: r.IssuerURL, JWKSURL: r.JWKSURL, Revision: r.Revision}
}

// trace records the checks of one evaluation: the dry run shows them all,
// the exchange keeps the first failure for the audit.
type trace struct {
	keep   bool // record passed checks too (dry run)
	steps  []*cohortv1.DryRunStep
	failed string
	detail string
}

// errRefused ends an evaluation with invalid_grant.
var errRefused = errors.New("refused")

func (t *trace) pass(check, detail string) {
	if t.keep {
		t.steps = append(t.steps, &cohortv1.DryRunStep{Check: check, Outcome: "passed", Detail: detail})
	}
}

func (t *trace) fail(check, format string, args ...any) error {
	t.failed, t.detail = check, truncate(fmt.Sprintf(format, args...), 1000)
	if t.keep {
		t.steps = append(t.steps, &cohortv1.DryRunStep{Check: check, Outcome: "failed", Detail: t.detail})
	}
	return errRefused
}

// policyRefused opens the audit detail of an exchange whose identity
// provider the egress policy refuses. It is a refusal (invalid_grant),
// not an outage: a 503 "retry shortly" would promise what never comes.
const policyRefused = "the egress policy refuses the identity provider's address, so this will not succeed " +
	"until an operator lists the host or its range in --federation-allow-hosts"

// unavailable ends an evaluation with 503: the issuer's keys could not be
// fetched. It is recorded like a failure.
func (t *trace) unavailable(check string, err error) error {
	t.fail(check, "%v", err)
	return errUnavailable
}

// notRun lists the checks after the first failure (dry run).
func (t *trace) notRun() {
	if !t.keep || t.failed == "" {
		return
	}
	i := slices.Index(checkOrder, t.failed)
	for _, c := range checkOrder[i+1:] {
		t.steps = append(t.steps, &cohortv1.DryRunStep{Check: c, Outcome: "not_run"})
	}
}

// verified is what a successful evaluation yields for the issued token.
type verified struct {
	subject string
	// lifetime is min(15 minutes, the subject token's remaining life), in
	// whole seconds.
	lifetime int64
	iat      time.Time
}

// evaluate runs every check after the policy was found and the token
// parsed, in the spec's order. It returns errRefused (invalid_grant),
// errUnavailable (503) or an internal error.
func (s *Service) evaluate(ctx context.Context, pol *policyRow, tok *SubjectToken, tr *trace) (*verified, error) {
	cfg := s.settings()
	if !pol.WorkloadIdentity {
		return nil, tr.fail(checkEntitlement, "the organization does not have the workload identity entitlement")
	}
	tr.pass(checkEntitlement, "")
	if !pol.Enabled {
		return nil, tr.fail(checkEnabled, "the policy is paused")
	}
	tr.pass(checkEnabled, "")
	// Size bounds come before any rule is evaluated.
	if err := tok.CheckLimits(); err != nil {
		return nil, tr.fail(checkLimits, "%v", err)
	}
	tr.pass(checkLimits, "")
	if tok.Alg != "ES256" && tok.Alg != "RS256" {
		return nil, tr.fail(checkAlgorithm, "alg %q: only ES256 and RS256 are accepted", truncate(tok.Alg, 32))
	}
	if tok.Kid == "" {
		return nil, tr.fail(checkAlgorithm, "the token header has no kid")
	}
	// RFC 7515 §4.1.11: a recipient that does not understand an extension
	// listed in crit must reject the token; we understand none.
	if _, ok := tok.Header["crit"]; ok {
		return nil, tr.fail(checkAlgorithm, "the token header's crit names extensions this service does not implement")
	}
	tr.pass(checkAlgorithm, tok.Alg)

	ks, err := s.stores.get(ctx, pol.issuer())
	if err != nil {
		if errors.Is(err, safehttp.ErrRefusedAddress) {
			return nil, tr.fail(checkIssuerKeys, "%s: %v", policyRefused, err)
		}
		if errors.Is(err, errUnavailable) {
			return nil, tr.unavailable(checkIssuerKeys, err)
		}
		return nil, err
	}
	tr.pass(checkIssuerKeys, "")
	if err := s.verifySignature(ctx, ks, tok); err != nil {
		if errors.Is(err, safehttp.ErrRefusedAddress) {
			return nil, tr.fail(checkSignature, "%s: %v", policyRefused, err)
		}
		if errors.Is(err, errUnavailable) {
			return nil, tr.unavailable(checkSignature, err)
		}
		return nil, tr.fail(checkSignature, "%v", err)
	}
	if tr.keep { // the detail is built only for the dry run
		tr.pass(checkSignature, "kid "+truncate(tok.Kid, 64))
	}

	now := s.now()
	v := &verified{iat: now.Truncate(time.Second)}
	remaining, err := s.checkTimes(tok, now, cfg.Leeway)
	if err != nil {
		return nil, tr.fail(checkExpiry, "%v", err)
	}
	v.lifetime = int64(math.Min(MaxAccessTokenLifetime.Seconds(), math.Floor(remaining)))
	if v.lifetime < 1 {
		return nil, tr.fail(checkExpiry, "less than a second of life left")
	}
	tr.pass(checkExpiry, "")

	iss, _, ok := tok.stringClaim("iss")
	if !ok || iss != pol.IssuerURL {
		return nil, tr.fail(checkIssuer, "iss %q does not equal the issuer URL %q", truncate(iss, 200), pol.IssuerURL)
	}
	tr.pass(checkIssuer, "")
	aud, ok := tok.audience()
	if !ok {
		return nil, tr.fail(checkAudience, "aud is missing, empty, or not a string or array of strings")
	}
	if !slices.Contains(aud, pol.Audience) {
		return nil, tr.fail(checkAudience, "aud does not contain %q", pol.Audience)
	}
	tr.pass(checkAudience, "")
	sub, _, ok := tok.stringClaim("sub")
	if !ok || sub == "" {
		return nil, tr.fail(checkSubject, "sub is missing or not a string")
	}
	if pol.Subject != "" && sub != pol.Subject {
		return nil, tr.fail(checkSubject, "sub %q does not equal %q", truncate(sub, 200), pol.Subject)
	}
	tr.pass(checkSubject, "")
	v.subject = sub

	scopes, scopesOK := tok.scopes()
	if pol.ScopesCheck != nil {
		if _, present := tok.Claims["scopes"]; !present {
			return nil, tr.fail(checkScopesClaim, "the token has no scopes claim")
		}
		if !scopesOK {
			return nil, tr.fail(checkScopesClaim, "scopes is not an array of strings")
		}
		if !slices.Contains(scopes, *pol.ScopesCheck) {
			return nil, tr.fail(checkScopesClaim, "scopes does not contain %q", *pol.ScopesCheck)
		}
	}
	tr.pass(checkScopesClaim, "")
	tokenType, typeOK := tok.tokenType()
	if pol.TokenTypeCheck != nil {
		if _, present := tok.Claims["token_type"]; !present {
			return nil, tr.fail(checkTypeClaim, "the token has no token_type claim")
		}
		if !typeOK {
			return nil, tr.fail(checkTypeClaim, "token_type is not a string")
		}
		if tokenType != *pol.TokenTypeCheck {
			return nil, tr.fail(checkTypeClaim, "token_type %q does not equal %q", truncate(tokenType, 200), *pol.TokenTypeCheck)
		}
	}
	tr.pass(checkTypeClaim, "")

	if pol.Condition != "" {
		cc, err := s.conds.get(pol.Condition)
		if err != nil {
			return nil, tr.fail(checkCondition, "the saved condition no longer compiles: %v", apierr.From(err).Message)
		}
		if cc.uses[varScopes] && !scopesOK {
			return nil, tr.fail(checkCondition, "scopes is not an array of strings")
		}
		if cc.uses[varTokenType] && !typeOK {
			return nil, tr.fail(checkCondition, "token_type is not a string")
		}
		ok, err := cc.eval(newConditionInput(sub, aud, scopes, tokenType))
		if err != nil {
			return nil, tr.fail(checkCondition, "evaluation error: %v", err)
		}
		if !ok {
			return nil, tr.fail(checkCondition, "the condition is false")
		}
	}
	tr.pass(checkCondition, "")

	switch {
	case pol.KeyDeleted:
		return nil, tr.fail(checkAPIKey, "the target API key is deleted")
	case pol.KeyDisabled:
		return nil, tr.fail(checkAPIKey, "the target API key is disabled")
	case pol.KeyKind != store.KeyWorkspace:
		return nil, tr.fail(checkAPIKey, "the target API key is not a workspace key")
	}
	tr.pass(checkAPIKey, "")
	return v, nil
}

// verifySignature finds the key by kid in the issuer's JWKS (keyfunc over
// the gated storage) and verifies the signature with golang-jwt's signing
// method. The key must match the algorithm: a P-256 key for ES256, an RSA
// key of at least 2048 bits for RS256.
func (s *Service) verifySignature(ctx context.Context, ks *keyStore, tok *SubjectToken) error {
	method := jwt.GetSigningMethod(tok.Alg)
	key, err := ks.kf.KeyfuncCtx(ctx)(&jwt.Token{Header: tok.Header, Method: method})
	if err != nil {
		if errors.Is(err, errUnavailable) {
			return err
		}
		if errors.Is(err, jwkset.ErrKeyNotFound) {
			return fmt.Errorf("no key with kid %q in the issuer's JWKS", truncate(tok.Kid, 64))
		}
		return fmt.Errorf("key %q: %v", truncate(tok.Kid, 64), err)
	}
	switch k := key.(type) {
	case *ecdsa.PublicKey:
		if tok.Alg != "ES256" || k.Curve != elliptic.P256() {
			return fmt.Errorf("key %q is not a P-256 key for %s", truncate(tok.Kid, 64), tok.Alg)
		}
	case *rsa.PublicKey:
		if tok.Alg != "RS256" || k.N.BitLen() < 2048 {
			return fmt.Errorf("key %q is not an RSA key of at least 2048 bits for %s", truncate(tok.Kid, 64), tok.Alg)
		}
	default:
		return fmt.Errorf("key %q has type %T, unusable for %s", truncate(tok.Kid, 64), key, tok.Alg)
	}
	if err := method.Verify(tok.SigningInput, tok.Signature, key); err != nil {
		return fmt.Errorf("bad signature: %v", err)
	}
	return nil
}

// checkTimes applies exp (required, a number, strictly in the future: no
// leeway) and nbf (with leeway) through jwt's validator, and returns the
// seconds of life left.
func (s *Service) checkTimes(tok *SubjectToken, now time.Time, leeway time.Duration) (float64, error) {
	exp, ok := tok.Claims["exp"].(float64)
	if _, present := tok.Claims["exp"]; !present {
		return 0, errors.New("exp is missing")
	}
	if !ok {
		return 0, errors.New("exp is not a number")
	}
	v := jwt.NewValidator(jwt.WithExpirationRequired(), jwt.WithLeeway(leeway), jwt.WithTimeFunc(func() time.Time { return now }))
	if err := v.Validate(jwt.MapClaims(tok.Claims)); err != nil {
		switch {
		case errors.Is(err, jwt.ErrTokenNotValidYet):
			return 0, errors.New("nbf is in the future")
		case errors.Is(err, jwt.ErrTokenExpired):
			return 0, errors.New("the token has expired")
		default:
			return 0, err
		}
	}
	remaining := exp - float64(now.UnixNano())/1e9
	if remaining <= 0 {
		return 0, errors.New("the token has expired")
	}
	return remaining, nil
}

// ExchangeResult is the spec's exchange response, field for field.
type ExchangeResult struct {
	AccessToken     string `json:"access_token"`
	IssuedTokenType string `json:"issued_token_type"`
	TokenType       string `json:"token_type"`
	ExpiresIn       int64  `json:"expires_in"`
	Scope           string `json:"scope"`
}

// Exchange performs one token exchange for a parsed form. Every refusal
// after the policy is found is the one invalid_grant; its precise cause
// goes to the organization's exchange audit. source is the caller's
// address, for the audit.
func (s *Service) Exchange(ctx context.Context, req *TokenRequest, source string) (*ExchangeResult, error) {
	tok, err := ParseSubjectToken(req.SubjectToken)
	if err != nil {
		return nil, invalidRequest("subject_token is not a JWT")
	}
	pol, err := s.exchangePolicy(ctx, req.PolicyID)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if pol == nil {
		// No organization to audit to: the log says why.
		s.log().InfoContext(ctx, "federation: exchange refused", "failed_check", checkPolicy, "source", source)
		return nil, errInvalidGrant
	}
	rec := &store.FederationExchange{ID: newExchangeID(), OrganizationID: pol.OrganizationID, PolicyID: pol.ID,
		IssuerID: pol.IssuerID, At: s.now(), SourceAddress: truncate(source, 64), APIKeyID: pol.APIKeyID}
	if sub, ok := tok.Claims["sub"].(string); ok {
		rec.Subject = truncate(sub, MaxSubLength)
	}
	tr := &trace{}
	v, err := s.evaluate(ctx, pol, tok, tr)
	if err != nil {
		rec.Outcome, rec.FailedCheck, rec.Detail = "refused", tr.failed, tr.detail
		if tr.failed == "" {
			rec.FailedCheck, rec.Detail = "internal", "internal error"
		}
		s.recordExchange(ctx, rec) //nolint:errcheck // the refusal stands; a failed write is logged
		switch {
		case errors.Is(err, errRefused):
			return nil, errInvalidGrant
		case errors.Is(err, errUnavailable):
			return nil, errTemporarilyUnavailable
		default:
			return nil, apierr.Internal(err)
		}
	}
	cfg := s.settings()
	jti := uuid.NewString()
	grant := &accessGrant{issuer: cfg.TokenIssuer, subject: v.subject, id: jti,
		issuedAt: v.iat.Unix(), expiresAt: v.iat.Unix() + v.lifetime,
		clientID: pol.APIKeyID, policyID: pol.ID, issuerID: pol.IssuerID}
	at, err := s.signer.issue(ctx, grant)
	if err != nil {
		rec.Outcome, rec.FailedCheck, rec.Detail = "refused", "internal", "signing failed"
		s.recordExchange(ctx, rec) //nolint:errcheck // the refusal stands; a failed write is logged
		return nil, apierr.Internal(err)
	}
	rec.Outcome, rec.TokenID = "issued", jti
	if err := s.recordExchange(ctx, rec); err != nil {
		// No token without its audit row.
		return nil, errAuditUnavailable.WithCause(err)
	}
	return &ExchangeResult{AccessToken: at, IssuedTokenType: TokenTypeAccessToken, TokenType: "Bearer",
		ExpiresIn: v.lifetime, Scope: scopeInference}, nil
}

// DryRun evaluates a pasted subject token against one of the caller's
// policies, check by check, exactly as Exchange would, without issuing a
// token or writing the audit. The token is not stored or logged.
func (s *Service) DryRun(ctx context.Context, p *auth.Principal, policyID, subjectToken string) (*cohortv1.DryRunResponse, error) {
	if err := requireAdmin(p); err != nil {
		return nil, err
	}
	if len(subjectToken) > MaxSubjectToken {
		return nil, apierr.BadRequest("subject_token must be at most %d bytes", MaxSubjectToken)
	}
	pol, err := s.loadPolicyRow(ctx, policyID, p.OrganizationID)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if pol == nil {
		return nil, apierr.NotFound("policy %q not found", truncate(policyID, 64))
	}
	tr := &trace{keep: true}
	tok, perr := ParseSubjectToken(subjectToken)
	if perr != nil {
		tr.fail(checkTokenFormat, "%v", perr)
	} else {
		tr.pass(checkTokenFormat, "")
		tr.pass(checkPolicy, "")
		if _, err := s.evaluate(ctx, pol, tok, tr); err != nil && !errors.Is(err, errRefused) && !errors.Is(err, errUnavailable) {
			return nil, apierr.Internal(err)
		}
	}
	tr.notRun()
	return &cohortv1.DryRunResponse{WouldIssue: tr.failed == "", Steps: tr.steps, FailedCheck: tr.failed}, nil
}

// recordExchange audits an exchange, durably before it returns, and counts
// it (Service.OnExchange). A token whose row could not be written is not
// handed out: its caller gets the error.
func (s *Service) recordExchange(ctx context.Context, rec *store.FederationExchange) error {
	err := s.audit.record(ctx, rec)
	if s.OnExchange != nil {
		s.OnExchange(rec.Outcome, rec.FailedCheck)
	}
	return err
}
