// Package accounts implements the organization admin's operations:
// organizations and entitlements, users and their departures, grants, and
// API keys. Every method takes the acting principal and authorizes it.
package accounts

import (
	"context"
	"database/sql"
	"errors"
	"net/mail"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"google.golang.org/protobuf/types/known/timestamppb"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/keys"
	"github.com/cohort-dev/cohort/internal/store"
)

// Service implements the admin operations over the store.
type Service struct {
	DB  *bun.DB
	Now func() time.Time
}

func (s *Service) now() time.Time {
	return store.Now(s.Now)
}

func requireManagement(p *auth.Principal) error {
	if p == nil {
		return apierr.Unauthenticated("missing API key")
	}
	if !p.IsManagement() {
		return apierr.Forbidden("this operation requires a management key")
	}
	return nil
}

// orgFor picks the organization an operation acts on: the caller's, or for
// the operator CLI the one it names.
func orgFor(p *auth.Principal, named string) (string, error) {
	if p.KeyKind == auth.KindOperator && named != "" {
		return named, nil
	}
	if p.OrganizationID == "" {
		return "", apierr.BadRequest("organization_id is required")
	}
	return p.OrganizationID, nil
}

func checkName(field, v string, max int) error {
	if strings.TrimSpace(v) == "" {
		return apierr.BadRequest("%s is required", field)
	}
	if utf8.RuneCountInString(v) > max {
		return apierr.BadRequest("%s must be at most %d characters", field, max)
	}
	return nil
}

// CreateOrganization creates an organization. Operator only.
func (s *Service) CreateOrganization(ctx context.Context, p *auth.Principal, req *cohortv1.CreateOrganizationRequest) (*cohortv1.Organization, error) {
	if p == nil || p.KeyKind != auth.KindOperator {
		return nil, apierr.Forbidden("only the operator can create organizations")
	}
	if err := checkName("name", req.GetName(), 100); err != nil {
		return nil, err
	}
	e := req.GetEntitlements()
	o := &store.Organization{
		ID: uuid.NewString(), Name: req.GetName(), CreatedAt: s.now(),
		InternsProgramme: e.GetInternsProgramme(), WorkloadIdentity: e.GetWorkloadIdentity(), VaultWrites: e.GetVaultWrites(),
	}
	if _, err := s.DB.NewInsert().Model(o).Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return OrganizationProto(o), nil
}

// SetEntitlements changes an organization's entitlements. Operator only.
func (s *Service) SetEntitlements(ctx context.Context, p *auth.Principal, orgID string, e *cohortv1.Entitlements) (*cohortv1.Organization, error) {
	if p == nil || p.KeyKind != auth.KindOperator {
		return nil, apierr.Forbidden("only the operator can change entitlements")
	}
	res, err := s.DB.NewUpdate().Model((*store.Organization)(nil)).
		Set("interns_programme = ?", e.GetInternsProgramme()).
		Set("workload_identity = ?", e.GetWorkloadIdentity()).
		Set("vault_writes = ?", e.GetVaultWrites()).
		Where("id = ?", orgID).Exec(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, apierr.NotFound("organization %q not found", orgID)
	}
	return s.GetOrganization(ctx, &auth.Principal{OrganizationID: orgID, KeyKind: auth.KindOperator})
}

// GetOrganization returns the caller's organization.
func (s *Service) GetOrganization(ctx context.Context, p *auth.Principal) (*cohortv1.Organization, error) {
	if err := requireManagement(p); err != nil {
		return nil, err
	}
	var o store.Organization
	if err := s.DB.NewSelect().Model(&o).Where("id = ?", p.OrganizationID).Scan(ctx); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, apierr.NotFound("organization not found")
		}
		return nil, apierr.Internal(err)
	}
	return OrganizationProto(&o), nil
}

// ListOrganizations lists every organization. Operator only.
func (s *Service) ListOrganizations(ctx context.Context, p *auth.Principal) ([]*cohortv1.Organization, error) {
	if p == nil || p.KeyKind != auth.KindOperator {
		return nil, apierr.Forbidden("only the operator can list organizations")
	}
	var os []store.Organization
	if err := s.DB.NewSelect().Model(&os).Order("created_at", "id").Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	out := make([]*cohortv1.Organization, len(os))
	for i := range os {
		out[i] = OrganizationProto(&os[i])
	}
	return out, nil
}

// CreateUser creates a user (or finds one by email) and makes them a member.
func (s *Service) CreateUser(ctx context.Context, p *auth.Principal, req *cohortv1.CreateUserRequest) (*cohortv1.User, error) {
	if err := requireManagement(p); err != nil {
		return nil, err
	}
	orgID, err := orgFor(p, req.GetOrganizationId())
	if err != nil {
		return nil, err
	}
	email := strings.ToLower(strings.TrimSpace(req.GetEmail()))
	if a, err := mail.ParseAddress(email); err != nil || a.Address != email || len(email) > 254 {
		return nil, apierr.BadRequest("email must be a plain email address")
	}
	name := req.GetName()
	if name == "" {
		name = email
	}
	if err := checkName("name", name, 100); err != nil {
		return nil, err
	}
	role := req.GetRole()
	if role == "" {
		role = "member"
	}
	if role != "admin" && role != "member" {
		return nil, apierr.BadRequest("role must be admin or member")
	}
	now := s.now()
	var out *cohortv1.User
	err = s.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if err := orgExists(ctx, tx, orgID); err != nil {
			return err
		}
		u := store.User{}
		err := tx.NewSelect().Model(&u).Where("email = ?", email).Scan(ctx)
		if errors.Is(err, sql.ErrNoRows) {
			u = store.User{ID: uuid.NewString(), Email: email, Name: name, CreatedAt: now}
			if _, err := tx.NewInsert().Model(&u).Exec(ctx); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		m := store.Membership{OrganizationID: orgID, UserID: u.ID, Role: role, JoinedAt: now}
		if _, err := tx.NewInsert().Model(&m).Exec(ctx); err != nil {
			if store.IsUniqueViolation(err) {
				return apierr.Conflict(apierr.ReasonConflict, "%s is already a member of this organization", email)
			}
			return err
		}
		out = UserProto(&u, &m)
		return nil
	})
	if err != nil {
		return nil, wrap(err)
	}
	return out, nil
}

func orgExists(ctx context.Context, db bun.IDB, orgID string) error {
	ok, err := db.NewSelect().Model((*store.Organization)(nil)).Where("id = ?", orgID).Exists(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return apierr.NotFound("organization %q not found", orgID)
	}
	return nil
}

// wrap keeps domain errors and turns anything else into an internal error.
func wrap(err error) error {
	var e *apierr.Error
	if errors.As(err, &e) {
		return e
	}
	return apierr.Internal(err)
}

type memberRow struct {
	store.User
	Role     string     `bun:"role"`
	JoinedAt time.Time  `bun:"joined_at"`
	LeftAt   *time.Time `bun:"left_at"`
}

// ListUsers lists the organization's members, departed ones included.
func (s *Service) ListUsers(ctx context.Context, p *auth.Principal) ([]*cohortv1.User, error) {
	if err := requireManagement(p); err != nil {
		return nil, err
	}
	var rows []memberRow
	err := s.DB.NewRaw(`SELECT u.*, m.role, m.joined_at, m.left_at FROM users u
		JOIN memberships m ON m.user_id = u.id WHERE m.organization_id = ? ORDER BY m.joined_at, u.id`, p.OrganizationID).Scan(ctx, &rows)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	out := make([]*cohortv1.User, len(rows))
	for i := range rows {
		r := &rows[i]
		out[i] = UserProto(&r.User, &store.Membership{Role: r.Role, JoinedAt: r.JoinedAt, LeftAt: r.LeftAt})
	}
	return out, nil
}

// MarkUserLeft records that a user left the organization. Their keys keep
// authenticating, but chat refuses them unless they hold a grant.
func (s *Service) MarkUserLeft(ctx context.Context, p *auth.Principal, req *cohortv1.MarkUserLeftRequest) (*cohortv1.User, error) {
	if err := requireManagement(p); err != nil {
		return nil, err
	}
	now := s.now()
	res, err := s.DB.NewUpdate().Model((*store.Membership)(nil)).Set("left_at = ?", now).
		Where("organization_id = ? AND user_id = ? AND left_at IS NULL", p.OrganizationID, req.GetUserId()).Exec(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, apierr.NotFound("user %q is not a current member of this organization", req.GetUserId())
	}
	var r memberRow
	err = s.DB.NewRaw(`SELECT u.*, m.role, m.joined_at, m.left_at FROM users u
		JOIN memberships m ON m.user_id = u.id WHERE m.organization_id = ? AND u.id = ?`, p.OrganizationID, req.GetUserId()).Scan(ctx, &r)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return UserProto(&r.User, &store.Membership{Role: r.Role, JoinedAt: r.JoinedAt, LeftAt: r.LeftAt}), nil
}

// CreateGrant gives a user (usually one who left) a grant over one workspace
// or, with no workspace, the whole organization.
func (s *Service) CreateGrant(ctx context.Context, p *auth.Principal, req *cohortv1.CreateGrantRequest) (*cohortv1.Grant, error) {
	if err := requireManagement(p); err != nil {
		return nil, err
	}
	ok, err := s.DB.NewSelect().Model((*store.Membership)(nil)).
		Where("organization_id = ? AND user_id = ?", p.OrganizationID, req.GetUserId()).Exists(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if !ok {
		return nil, apierr.NotFound("user %q is not in this organization", req.GetUserId())
	}
	g := &store.Grant{ID: uuid.NewString(), OrganizationID: p.OrganizationID, UserID: req.GetUserId(), CreatedAt: s.now()}
	if ws := req.GetWorkspaceId(); ws != "" {
		if err := s.workspaceInOrg(ctx, p.OrganizationID, ws); err != nil {
			return nil, err
		}
		g.WorkspaceID = &ws
	}
	if _, err := s.DB.NewInsert().Model(g).Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return GrantProto(g), nil
}

func (s *Service) workspaceInOrg(ctx context.Context, orgID, wsID string) error {
	ok, err := s.DB.NewSelect().Model((*store.Workspace)(nil)).Where("id = ? AND organization_id = ?", wsID, orgID).Exists(ctx)
	if err != nil {
		return apierr.Internal(err)
	}
	if !ok {
		return apierr.NotFound("workspace %q not found", wsID)
	}
	return nil
}

// CreateAPIKey makes a key and returns it once with its record.
func (s *Service) CreateAPIKey(ctx context.Context, p *auth.Principal, req *cohortv1.CreateApiKeyRequest) (*cohortv1.CreateApiKeyResponse, error) {
	if err := requireManagement(p); err != nil {
		return nil, err
	}
	orgID, err := orgFor(p, req.GetOrganizationId())
	if err != nil {
		return nil, err
	}
	kind := req.GetKind()
	ws := req.GetWorkspaceId()
	switch kind {
	case store.KeyManagement:
		if ws != "" {
			return nil, apierr.BadRequest("a management key is not bound to a workspace: omit workspace_id")
		}
	case store.KeyWorkspace:
		if ws == "" {
			return nil, apierr.BadRequest("workspace_id is required for a workspace key")
		}
	case store.KeyPersonal:
	default:
		return nil, apierr.BadRequest("kind must be management, workspace or personal")
	}
	name := req.GetName()
	if name == "" {
		name = kind + " key"
	}
	if err := checkName("name", name, 100); err != nil {
		return nil, err
	}
	userID := req.GetUserId()
	if userID == "" {
		userID = p.UserID
	}
	if userID == "" {
		return nil, apierr.BadRequest("user_id is required")
	}
	var m store.Membership
	err = s.DB.NewSelect().Model(&m).Where("organization_id = ? AND user_id = ?", orgID, userID).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && m.LeftAt != nil) {
		return nil, apierr.NotFound("user %q is not a current member of this organization", userID)
	} else if err != nil {
		return nil, apierr.Internal(err)
	}
	if ws != "" {
		if err := s.workspaceInOrg(ctx, orgID, ws); err != nil {
			return nil, err
		}
	}
	key, hash, err := keys.New(kind)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	k := &store.APIKey{ID: uuid.NewString(), OrganizationID: orgID, UserID: userID, Kind: kind, Name: name,
		Prefix: keys.Display(key), Hash: hash, CreatedAt: s.now()}
	if ws != "" {
		k.WorkspaceID = &ws
	}
	if _, err := s.DB.NewInsert().Model(k).Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return &cohortv1.CreateApiKeyResponse{ApiKey: APIKeyProto(k), Key: key}, nil
}

// ListAPIKeys lists the organization's keys that are not deleted.
func (s *Service) ListAPIKeys(ctx context.Context, p *auth.Principal, req *cohortv1.ListApiKeysRequest) ([]*cohortv1.ApiKey, error) {
	if err := requireManagement(p); err != nil {
		return nil, err
	}
	var ks []store.APIKey
	q := s.DB.NewSelect().Model(&ks).Where("organization_id = ? AND deleted_at IS NULL", p.OrganizationID).Order("created_at", "id")
	if ws := req.GetWorkspaceId(); ws != "" {
		q = q.Where("workspace_id = ?", ws)
	}
	if err := q.Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	out := make([]*cohortv1.ApiKey, len(ks))
	for i := range ks {
		out[i] = APIKeyProto(&ks[i])
	}
	return out, nil
}

// setKeyState updates one column of a live key of the caller's organization.
func (s *Service) setKeyState(ctx context.Context, p *auth.Principal, id, set string, arg any) (*cohortv1.ApiKey, error) {
	if err := requireManagement(p); err != nil {
		return nil, err
	}
	res, err := s.DB.NewUpdate().Model((*store.APIKey)(nil)).Set(set, arg).
		Where("id = ? AND organization_id = ? AND deleted_at IS NULL", id, p.OrganizationID).Exec(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, apierr.NotFound("API key %q not found", id)
	}
	var k store.APIKey
	if err := s.DB.NewSelect().Model(&k).Where("id = ?", id).Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return APIKeyProto(&k), nil
}

// DisableAPIKey stops a key from working on the next request.
func (s *Service) DisableAPIKey(ctx context.Context, p *auth.Principal, id string) (*cohortv1.ApiKey, error) {
	return s.setKeyState(ctx, p, id, "disabled_at = ?", s.now())
}

// EnableAPIKey lets a disabled key work again.
func (s *Service) EnableAPIKey(ctx context.Context, p *auth.Principal, id string) (*cohortv1.ApiKey, error) {
	return s.setKeyState(ctx, p, id, "disabled_at = ?", nil)
}

// DeleteAPIKey deletes a key for good; its record stays for audit.
func (s *Service) DeleteAPIKey(ctx context.Context, p *auth.Principal, id string) (*cohortv1.ApiKey, error) {
	return s.setKeyState(ctx, p, id, "deleted_at = ?", s.now())
}

// OrganizationProto converts a row.
func OrganizationProto(o *store.Organization) *cohortv1.Organization {
	return &cohortv1.Organization{Id: o.ID, Name: o.Name, CreatedAt: timestamppb.New(o.CreatedAt),
		Entitlements: &cohortv1.Entitlements{InternsProgramme: o.InternsProgramme, WorkloadIdentity: o.WorkloadIdentity, VaultWrites: o.VaultWrites}}
}

// UserProto converts a user and their membership.
func UserProto(u *store.User, m *store.Membership) *cohortv1.User {
	out := &cohortv1.User{Id: u.ID, Email: u.Email, Name: u.Name, Role: m.Role, JoinedAt: timestamppb.New(m.JoinedAt)}
	if m.LeftAt != nil {
		out.LeftAt = timestamppb.New(*m.LeftAt)
	}
	return out
}

// GrantProto converts a row.
func GrantProto(g *store.Grant) *cohortv1.Grant {
	out := &cohortv1.Grant{Id: g.ID, UserId: g.UserID, CreatedAt: timestamppb.New(g.CreatedAt)}
	if g.WorkspaceID != nil {
		out.WorkspaceId = *g.WorkspaceID
	}
	return out
}

// APIKeyProto converts a row; the hash never leaves the store.
func APIKeyProto(k *store.APIKey) *cohortv1.ApiKey {
	out := &cohortv1.ApiKey{Id: k.ID, Kind: k.Kind, Name: k.Name, Prefix: k.Prefix, CreatedBy: k.UserID,
		CreatedAt: timestamppb.New(k.CreatedAt), Disabled: k.DisabledAt != nil}
	if k.WorkspaceID != nil {
		out.WorkspaceId = *k.WorkspaceID
	}
	if k.DeletedAt != nil {
		out.DeletedAt = timestamppb.New(*k.DeletedAt)
	}
	return out
}
