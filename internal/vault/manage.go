package vault

import (
	"context"
	"fmt"
	"net/http"

	"google.golang.org/protobuf/types/known/timestamppb"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/store"
)

// Bounds of a list page.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// ListIntern lists the metadata of an intern's secrets, by name. Reads are
// not writes: the vault-writes switch does not apply.
func (s *Service) ListIntern(ctx context.Context, p *auth.Principal, req *cohortv1.ListInternSecretsRequest) (*cohortv1.ListInternSecretsResponse, error) {
	internID, err := parseInternID(req.GetInternId())
	if err != nil {
		return nil, err
	}
	limit, err := listLimit(req.GetLimit(), req.GetAfter())
	if err != nil {
		return nil, err
	}
	in, err := s.Interns.Load(ctx, p, internID)
	if err != nil {
		return nil, err
	}
	out, more, err := s.list(ctx, store.VaultScopeIntern, in.ID, limit, req.GetAfter())
	if err != nil {
		return nil, err
	}
	return &cohortv1.ListInternSecretsResponse{Secrets: out, HasMore: more}, nil
}

// ListWorkspace lists the metadata of the key's workspace's secrets.
func (s *Service) ListWorkspace(ctx context.Context, p *auth.Principal, req *cohortv1.ListWorkspaceSecretsRequest) (*cohortv1.ListWorkspaceSecretsResponse, error) {
	limit, err := listLimit(req.GetLimit(), req.GetAfter())
	if err != nil {
		return nil, err
	}
	out, more, err := s.list(ctx, store.VaultScopeWorkspace, p.WorkspaceID, limit, req.GetAfter())
	if err != nil {
		return nil, err
	}
	return &cohortv1.ListWorkspaceSecretsResponse{Secrets: out, HasMore: more}, nil
}

// DeleteIntern deletes one of an intern's secrets. Deleting is a write: it
// answers 503 while vault writes are disabled.
func (s *Service) DeleteIntern(ctx context.Context, p *auth.Principal, req *cohortv1.DeleteInternSecretRequest) (*cohortv1.DeleteInternSecretResponse, error) {
	internID, err := parseInternID(req.GetInternId())
	if err != nil {
		return nil, err
	}
	if err := CheckName(req.GetName()); err != nil {
		return nil, err
	}
	in, err := s.Interns.Load(ctx, p, internID)
	if err != nil {
		return nil, err
	}
	if err := s.delete(ctx, store.VaultScopeIntern, in.ID, req.GetName()); err != nil {
		return nil, err
	}
	return &cohortv1.DeleteInternSecretResponse{}, nil
}

// DeleteWorkspace deletes one of the key's workspace's secrets.
func (s *Service) DeleteWorkspace(ctx context.Context, p *auth.Principal, req *cohortv1.DeleteWorkspaceSecretRequest) (*cohortv1.DeleteWorkspaceSecretResponse, error) {
	if err := CheckName(req.GetName()); err != nil {
		return nil, err
	}
	if err := s.delete(ctx, store.VaultScopeWorkspace, p.WorkspaceID, req.GetName()); err != nil {
		return nil, err
	}
	return &cohortv1.DeleteWorkspaceSecretResponse{}, nil
}

// listLimit applies the page bounds; after, when given, is a name.
func listLimit(limit int32, after string) (int, error) {
	switch {
	case limit == 0:
		limit = DefaultListLimit
	case limit < 1 || limit > MaxListLimit:
		return 0, apierr.BadRequest("limit must be 1 to %d, got %d", MaxListLimit, limit)
	}
	if after != "" {
		if err := CheckName(after); err != nil {
			return 0, apierr.BadRequest("after must be a secret name: %s", err.(*apierr.Error).Message)
		}
	}
	return int(limit), nil
}

func (s *Service) list(ctx context.Context, scope, owner string, limit int, after string) ([]*cohortv1.SecretMetadata, bool, error) {
	v, err := s.findVault(ctx, scope, owner)
	if err == errSecretNotFound {
		return []*cohortv1.SecretMetadata{}, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	var rows []store.VaultSecret
	// Only the metadata columns: the ciphertext stays in the database.
	q := s.DB.NewSelect().Model(&rows).Column("vault_id", "name", "hosts", "fingerprint", "created_at", "updated_at").
		Where("vault_id = ?", v.ID).Order("name").Limit(int64(limit + 1))
	if after != "" {
		q = q.Where("name > ?", after)
	}
	if err := q.Scan(ctx); err != nil {
		return nil, false, apierr.Internal(fmt.Errorf("list vault %s: %w", v.ID, err))
	}
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
	}
	out := make([]*cohortv1.SecretMetadata, len(rows))
	for i := range rows {
		out[i] = metadata(&rows[i])
	}
	return out, more, nil
}

func (s *Service) delete(ctx context.Context, scope, owner, name string) error {
	v, err := s.findVault(ctx, scope, owner)
	if err != nil {
		return err
	}
	res, err := s.DB.NewDelete().Model((*store.VaultSecret)(nil)).Where("vault_id = ? AND name = ?", v.ID, name).Exec(ctx)
	if err != nil {
		return apierr.Internal(fmt.Errorf("delete from vault %s: %w", v.ID, err))
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errSecretNotFound
	}
	return nil
}

// ListReleases lists the organization's audited release decisions, newest
// first, for organization admins (management keys only).
func (s *Service) ListReleases(ctx context.Context, p *auth.Principal, req *cohortv1.ListSecretReleasesRequest) (*cohortv1.ListSecretReleasesResponse, error) {
	if p == nil {
		return nil, apierr.Unauthenticated("missing API key")
	}
	if p.KeyKind != auth.KindOperator {
		// A vault read like any other: the programme's plain 404 first.
		if err := interns.CheckProgramme(p); err != nil {
			return nil, err
		}
	}
	if p.KeyKind != store.KeyManagement && p.KeyKind != auth.KindOperator {
		return nil, apierr.New(http.StatusForbidden, apierr.ReasonForbidden, "the vault audit requires a management key")
	}
	limit := int(req.GetLimit())
	switch {
	case limit == 0:
		limit = DefaultListLimit
	case limit < 1 || limit > MaxListLimit:
		return nil, apierr.BadRequest("limit must be 1 to %d, got %d", MaxListLimit, limit)
	}
	q := s.DB.NewSelect().Model((*store.VaultRelease)(nil)).Where("organization_id = ?", p.OrganizationID)
	if id := req.GetInternId(); id != "" {
		q = q.Where("intern_id = ?", id)
	}
	if b := req.GetBefore(); b != "" {
		var last store.VaultRelease
		if err := s.DB.NewSelect().Model(&last).Where("id = ? AND organization_id = ?", b, p.OrganizationID).Scan(ctx); err != nil {
			return nil, apierr.BadRequest("before: no release %q in this organization", b)
		}
		q = q.Where("(created_at < ? OR (created_at = ? AND id < ?))", last.CreatedAt, last.CreatedAt, last.ID)
	}
	var rows []store.VaultRelease
	if err := q.Order("created_at DESC", "id DESC").Limit(int64(limit+1)).Scan(ctx, &rows); err != nil {
		return nil, apierr.Internal(fmt.Errorf("list vault releases: %w", err))
	}
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
	}
	out := make([]*cohortv1.SecretRelease, len(rows))
	for i, r := range rows {
		out[i] = &cohortv1.SecretRelease{Id: r.ID, InternId: r.InternID, VaultId: r.VaultID, VaultScope: r.VaultScope,
			SecretName: r.SecretName, Host: r.Host, RunId: r.RunID, Outcome: r.Outcome, Reason: r.Reason, Actor: r.Actor,
			CreatedAt: timestamppb.New(r.CreatedAt)}
	}
	return &cohortv1.ListSecretReleasesResponse{Releases: out, HasMore: more}, nil
}
