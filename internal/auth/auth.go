// Package auth turns a bearer credential into a Principal: the organization,
// workspace, user and key kind a request acts as. Key state is read from the
// database on every request, so a disabled or deleted key stops working on
// the very next one.
//
// Every route declares what it admits (Access: the credential scope and
// the route's caller checks) where internal/server registers it; Handler
// (REST) and Interceptor (Connect) enforce the declaration, once per
// request.
package auth

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/keys"
	"github.com/cohort-dev/cohort/internal/store"
)

// KindOperator is the principal of the operator CLI, which acts on the
// database directly and may do everything a management key may.
const KindOperator = "operator"

// Principal is who a request acts as.
type Principal struct {
	OrganizationID string
	KeyID          string
	// KeyKind is store.KeyManagement, KeyWorkspace, KeyPersonal or KindOperator.
	KeyKind string
	// WorkspaceID is a workspace key's workspace or a personal key's active
	// workspace; empty for management keys.
	WorkspaceID string
	// UserID is the user who created the key (the user the key acts as).
	UserID string

	InternsProgramme bool
	WorkloadIdentity bool
	VaultWrites      bool

	// CreatorLeft is set when the key's creator has left the organization;
	// CreatorHasGrant when that user still holds a grant covering the key.
	CreatorLeft     bool
	CreatorHasGrant bool

	// AccessToken is set when the credential was a federation access token
	// acting as the key, rather than the key itself.
	AccessToken bool
}

// IsManagement reports whether p may perform organization admin operations.
func (p *Principal) IsManagement() bool {
	return p.KeyKind == store.KeyManagement || p.KeyKind == KindOperator
}

// Departed reports whether the key's creator left and holds no grant.
func (p *Principal) Departed() bool { return p.CreatorLeft && !p.CreatorHasGrant }

// Operator returns the principal of the operator CLI for an organization.
func Operator(orgID string) *Principal {
	return &Principal{OrganizationID: orgID, KeyKind: KindOperator, InternsProgramme: true, WorkloadIdentity: true, VaultWrites: true}
}

type ctxKey struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// From returns the principal in ctx, or nil.
func From(ctx context.Context) *Principal {
	p, _ := ctx.Value(ctxKey{}).(*Principal)
	return p
}

// Require returns the principal in ctx or a 401.
func Require(ctx context.Context) (*Principal, error) {
	if p := From(ctx); p != nil {
		return p, nil
	}
	return nil, apierr.Unauthenticated("missing API key")
}

// TokenVerifier checks a federation access token and returns the id of the
// API key it acts as. The federation package implements it.
type TokenVerifier interface {
	VerifyAccessToken(ctx context.Context, token string) (keyID string, err error)
}

// Authenticator resolves bearer credentials against the database.
type Authenticator struct {
	DB *bun.DB
	// Tokens, when set, accepts federation access tokens (JWTs). Which
	// routes take one is their Access (Scope).
	Tokens TokenVerifier

	mu    sync.Mutex
	stmts map[stmtKey]*sql.Stmt
}

// A Join reads one more row in the same query as the key, so that a hot
// route (the chat door) pays one database round trip, not two. Its SQL is
// a LEFT JOIN that may refer to the key's row as k; when no row matches,
// its columns are NULL.
type Join struct {
	// Name identifies the join's prepared statements.
	Name string
	// SQL returns the joined columns, each preceded by a comma, and the
	// JOIN clause, which refers to the join's argument as ph.
	SQL func(ph string) (columns, join string)
}

// stmtKey names a prepared lookup: by hash or by id, with a join or not
// (name "").
type stmtKey struct {
	join string
	byID bool
}

// keyColumns and keyFrom are the one query behind every authenticated
// request, written by hand beside bun and prepared once (stmt): bun sends
// literal SQL, which SQLite parses again on every call. Preparing it cut the
// request path's overhead over a bare insert from about 140 µs to 56 µs
// (docs/benchmarks.md as of 233a0f0, Workspace creation, SQLite); reading the intern in
// the same prepared query (a Join) took a chat turn through the REST door
// from 415.7 to 317.1 µs on SQLite and 740.5 to 599.7 µs on PostgreSQL
// (docs/benchmarks.md as of 233a0f0, "Chat, round 3").
const keyColumns = `SELECT k.id, k.organization_id, k.workspace_id, k.user_id, k.kind, k.hash,
	k.disabled_at IS NOT NULL, k.deleted_at IS NOT NULL,
	o.interns_programme, o.workload_identity, o.vault_writes,
	m.user_id IS NOT NULL AND m.left_at IS NULL,
	EXISTS (SELECT 1 FROM grants g WHERE g.organization_id = k.organization_id AND g.user_id = k.user_id
		AND (g.workspace_id IS NULL OR g.workspace_id = k.workspace_id))`

const keyFrom = `
FROM api_keys k
JOIN organizations o ON o.id = k.organization_id
LEFT JOIN memberships m ON m.organization_id = k.organization_id AND m.user_id = k.user_id
`

type keyRow struct {
	id, org, user, kind, hash                 string
	workspace                                 sql.NullString
	disabled, deleted                         bool
	internsProgramme, workloadIdentity, vault bool
	member, hasGrant                          bool
}

// stmt returns the prepared lookup by hash or by id, with j's columns and
// clause when j is not nil. Each is prepared once: parsing the query cost
// more than running it.
func (a *Authenticator) stmt(byID bool, j *Join) (*sql.Stmt, error) {
	k := stmtKey{byID: byID}
	if j != nil {
		k.join = j.Name
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if st, ok := a.stmts[k]; ok {
		return st, nil
	}
	// SQLite's numbered ?NNN lets the join's argument come first in the text.
	kph, jph := store.Placeholder(a.DB, 1), store.Placeholder(a.DB, 2)
	var cols, clause string
	if j != nil {
		cols, clause = j.SQL(jph)
	}
	where := "\nWHERE k.hash = "
	if byID {
		where = "\nWHERE k.id = "
	}
	// Not the request's context: a cancelled first request must not poison the statement.
	st, err := a.DB.DB.PrepareContext(context.Background(), keyColumns+cols+keyFrom+clause+where+kph)
	if err != nil {
		return nil, err
	}
	if a.stmts == nil {
		a.stmts = map[stmtKey]*sql.Stmt{}
	}
	a.stmts[k] = st
	return st, nil
}

// Bearer resolves the value of an Authorization header.
func (a *Authenticator) Bearer(ctx context.Context, header string) (*Principal, error) {
	return a.BearerJoin(ctx, header, nil, nil)
}

// BearerJoin is Bearer that also reads j's row for arg in the same query,
// scanning its columns into dest once the credential is accepted. With a
// nil j it is Bearer.
func (a *Authenticator) BearerJoin(ctx context.Context, header string, j *Join, arg any, dest ...any) (*Principal, error) {
	scheme, cred, ok := strings.Cut(header, " ")
	if header == "" {
		return nil, apierr.Unauthenticated("missing API key: send Authorization: Bearer <API_KEY>")
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || cred == "" {
		return nil, apierr.Unauthenticated("malformed Authorization header: want Bearer <API_KEY>")
	}
	cred = strings.TrimSpace(cred)
	if keys.WellFormed(cred) {
		h := keys.Hash(cred)
		return a.lookup(ctx, false, h, h, j, arg, dest)
	}
	if a.Tokens != nil && strings.Count(cred, ".") == 2 {
		keyID, err := a.Tokens.VerifyAccessToken(ctx, cred)
		if err != nil {
			return nil, err
		}
		p, err := a.lookup(ctx, true, keyID, "", j, arg, dest)
		if err != nil {
			return nil, err
		}
		p.AccessToken = true
		return p, nil
	}
	return nil, apierr.Unauthenticated("invalid API key")
}

func (a *Authenticator) lookup(ctx context.Context, byID bool, key, wantHash string, j *Join, jarg any, jdest []any) (*Principal, error) {
	st, err := a.stmt(byID, j)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	var r keyRow
	args := []any{key}
	if j != nil {
		args = append(args, jarg)
	}
	err = st.QueryRowContext(ctx, args...).Scan(append([]any{&r.id, &r.org, &r.workspace, &r.user, &r.kind, &r.hash,
		&r.disabled, &r.deleted, &r.internsProgramme, &r.workloadIdentity, &r.vault, &r.member, &r.hasGrant}, jdest...)...)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, apierr.Unauthenticated("invalid API key")
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	// The index lookup found the row; compare in constant time anyway so the
	// decision never rests on a short-circuiting string comparison.
	if wantHash != "" && !keys.Equal(r.hash, wantHash) {
		return nil, apierr.Unauthenticated("invalid API key")
	}
	if r.deleted {
		return nil, apierr.Unauthenticated("invalid API key")
	}
	if r.disabled {
		return nil, apierr.Unauthenticated("API key is disabled")
	}
	return &Principal{
		OrganizationID:   r.org,
		KeyID:            r.id,
		KeyKind:          r.kind,
		WorkspaceID:      r.workspace.String,
		UserID:           r.user,
		InternsProgramme: r.internsProgramme,
		WorkloadIdentity: r.workloadIdentity,
		VaultWrites:      r.vault,
		CreatorLeft:      !r.member,
		CreatorHasGrant:  r.hasGrant,
	}, nil
}
