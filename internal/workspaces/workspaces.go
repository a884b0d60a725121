// Package workspaces implements workspace creation and reads (spec endpoint
// 4). Validation lives here, once, for both the REST and Connect doors.
package workspaces

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"google.golang.org/protobuf/types/known/timestamppb"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/store"
)

// Bounds from the spec's Limits table, and ours where it is silent
// (ADR 0001).
const (
	MaxName         = 100
	MaxSlug         = 50
	MaxDescription  = 500
	MaxModel        = 256
	MaxLoggingKeys  = 100
	MinSamplingRate = 0.0001
	MaxSamplingRate = 1.0
)

// ProviderSorts are the accepted default_provider_sort values.
var ProviderSorts = []string{"price", "throughput", "latency", "exacto"}

var slugRE = regexp.MustCompile(`^[a-z0-9]+(?:-[a-z0-9]+)*$`)

// Service implements the workspace operations.
type Service struct {
	DB  *bun.DB
	Now func() time.Time
}

func (s *Service) now() time.Time {
	return store.Now(s.Now)
}

// Create validates req and creates a workspace in the caller's organization.
// It requires a management key.
func (s *Service) Create(ctx context.Context, p *auth.Principal, req *cohortv1.CreateWorkspaceRequest) (*cohortv1.Workspace, error) {
	if p == nil {
		return nil, apierr.Unauthenticated("missing API key")
	}
	if !p.IsManagement() {
		return nil, apierr.Forbidden("creating a workspace requires a management key")
	}
	w, explicitSlug, err := validate(req)
	if err != nil {
		return nil, err
	}
	w.ID = uuid.NewString()
	w.OrganizationID = p.OrganizationID
	w.CreatedAt = s.now()
	w.CreatedBy = p.UserID
	if ids := req.GetIoLoggingApiKeyIds(); ids != nil {
		if err := s.checkKeys(ctx, p.OrganizationID, ids.GetIds()); err != nil {
			return nil, err
		}
	}
	base := w.Slug
	for attempt := 1; ; attempt++ {
		_, err := s.DB.NewInsert().Model(w).Exec(ctx)
		if err == nil {
			return Proto(w), nil
		}
		if !store.IsUniqueViolation(err) {
			return nil, apierr.Internal(err)
		}
		if explicitSlug {
			return nil, apierr.Conflict(apierr.ReasonConflict, "slug %q is already used by a workspace of this organization", w.Slug)
		}
		if attempt >= 50 {
			return nil, apierr.Conflict(apierr.ReasonConflict, "could not derive a free slug from the name: send a slug")
		}
		w.Slug = withSuffix(base, attempt+1)
	}
}

func withSuffix(base string, n int) string {
	suffix := fmt.Sprintf("-%d", n)
	if len(base)+len(suffix) > MaxSlug {
		base = strings.TrimRight(base[:MaxSlug-len(suffix)], "-")
	}
	return base + suffix
}

// validate checks every field and fills defaults. It touches no database.
func validate(req *cohortv1.CreateWorkspaceRequest) (w *store.Workspace, explicitSlug bool, err error) {
	w = &store.Workspace{IOLoggingSamplingRate: 1}
	if req.Name == nil {
		return nil, false, apierr.BadRequest("name is required")
	}
	w.Name = req.GetName()
	if err := text("name", w.Name, MaxName, true); err != nil {
		return nil, false, err
	}
	if req.Slug != nil {
		w.Slug = req.GetSlug()
		explicitSlug = true
		if n := utf8.RuneCountInString(w.Slug); n < 1 || n > MaxSlug {
			return nil, false, apierr.BadRequest("slug must be 1 to %d characters", MaxSlug)
		}
		if !slugRE.MatchString(w.Slug) {
			return nil, false, apierr.BadRequest("slug must be lowercase letters and digits in segments separated by single hyphens, with no leading or trailing hyphen")
		}
	} else {
		w.Slug = Slugify(w.Name)
	}
	if req.Description != nil {
		w.Description = req.GetDescription()
		if err := text("description", w.Description, MaxDescription, false); err != nil {
			return nil, false, err
		}
	}
	if req.DefaultTextModel != nil {
		w.DefaultTextModel = req.GetDefaultTextModel()
		if err := text("default_text_model", w.DefaultTextModel, MaxModel, false); err != nil {
			return nil, false, err
		}
	}
	if req.DefaultImageModel != nil {
		w.DefaultImageModel = req.GetDefaultImageModel()
		if err := text("default_image_model", w.DefaultImageModel, MaxModel, false); err != nil {
			return nil, false, err
		}
	}
	w.DefaultProviderSort = ProviderSorts[0]
	if req.DefaultProviderSort != nil {
		w.DefaultProviderSort = req.GetDefaultProviderSort()
		ok := false
		for _, v := range ProviderSorts {
			ok = ok || v == w.DefaultProviderSort
		}
		if !ok {
			return nil, false, apierr.BadRequest("default_provider_sort must be one of price, throughput, latency, exacto")
		}
	}
	if req.IoLoggingSamplingRate != nil {
		r := req.GetIoLoggingSamplingRate()
		if !(r >= MinSamplingRate && r <= MaxSamplingRate) { // also refuses NaN
			return nil, false, apierr.BadRequest("io_logging_sampling_rate must be between 0.0001 and 1")
		}
		w.IOLoggingSamplingRate = r
	}
	if ids := req.GetIoLoggingApiKeyIds(); ids != nil {
		list := ids.GetIds()
		if len(list) > MaxLoggingKeys {
			return nil, false, apierr.BadRequest("io_logging_api_key_ids may hold at most %d ids", MaxLoggingKeys)
		}
		seen := map[string]bool{}
		uniq := make([]string, 0, len(list))
		for _, id := range list {
			if _, err := uuid.Parse(id); err != nil {
				return nil, false, apierr.BadRequest("io_logging_api_key_ids: %q is not an API key id", truncate(id))
			}
			if !seen[id] {
				seen[id] = true
				uniq = append(uniq, id)
			}
		}
		b, _ := json.Marshal(uniq)
		js := string(b)
		w.IOLoggingAPIKeyIDs = &js
	}
	w.IsDataDiscountLoggingEnabled = req.GetIsDataDiscountLoggingEnabled()
	w.IsObservabilityBroadcastEnabled = req.GetIsObservabilityBroadcastEnabled()
	w.IsObservabilityIOLoggingEnabled = req.GetIsObservabilityIoLoggingEnabled()
	return w, explicitSlug, nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// text checks a free-text field: length in characters, no control
// characters, and for required fields not blank.
func text(field, v string, max int, required bool) error {
	if required && strings.TrimSpace(v) == "" {
		return apierr.BadRequest("%s must not be empty", field)
	}
	if n := utf8.RuneCountInString(v); n > max {
		return apierr.BadRequest("%s must be at most %d characters (got %d)", field, max, n)
	}
	if !utf8.ValidString(v) {
		return apierr.BadRequest("%s must be valid UTF-8", field)
	}
	for _, r := range v {
		if unicode.IsControl(r) && !(field == "description" && (r == '\n' || r == '\t')) {
			return apierr.BadRequest("%s must not contain control characters", field)
		}
	}
	return nil
}

// Slugify derives a slug from a name: lowercase ASCII letters and digits,
// other runs become one hyphen, cut to 50 characters. A name with no ASCII
// letter or digit gives "workspace".
func Slugify(name string) string {
	var b strings.Builder
	hyphen := false
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			if hyphen && b.Len() > 0 {
				b.WriteByte('-')
			}
			hyphen = false
			b.WriteRune(r)
			if b.Len() >= MaxSlug {
				break
			}
		} else {
			hyphen = true
		}
	}
	s := strings.TrimRight(b.String(), "-")
	if s == "" {
		return "workspace"
	}
	return s
}

// checkKeys refuses ids that are not live keys of the organization.
func (s *Service) checkKeys(ctx context.Context, orgID string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	var found []string
	err := s.DB.NewSelect().Model((*store.APIKey)(nil)).Column("id").
		Where("organization_id = ? AND deleted_at IS NULL AND id IN (?)", orgID, bun.List(ids)).Scan(ctx, &found)
	if err != nil {
		return apierr.Internal(err)
	}
	have := map[string]bool{}
	for _, id := range found {
		have[id] = true
	}
	for _, id := range ids {
		if !have[id] {
			return apierr.BadRequest("io_logging_api_key_ids: %q is not an API key of this organization", id)
		}
	}
	return nil
}

// Get returns one workspace. Management keys see every workspace of their
// organization; other keys see only their own.
func (s *Service) Get(ctx context.Context, p *auth.Principal, id string) (*cohortv1.Workspace, error) {
	if p == nil {
		return nil, apierr.Unauthenticated("missing API key")
	}
	if !p.IsManagement() && id != p.WorkspaceID {
		return nil, apierr.NotFound("workspace %q not found", id)
	}
	var w store.Workspace
	err := s.DB.NewSelect().Model(&w).Where("id = ? AND organization_id = ?", id, p.OrganizationID).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, apierr.NotFound("workspace %q not found", id)
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return Proto(&w), nil
}

// List returns the workspaces the caller can see, oldest first.
func (s *Service) List(ctx context.Context, p *auth.Principal) ([]*cohortv1.Workspace, error) {
	if p == nil {
		return nil, apierr.Unauthenticated("missing API key")
	}
	var ws []store.Workspace
	q := s.DB.NewSelect().Model(&ws).Where("organization_id = ?", p.OrganizationID).Order("created_at", "id")
	if !p.IsManagement() {
		q = q.Where("id = ?", p.WorkspaceID)
	}
	if err := q.Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	out := make([]*cohortv1.Workspace, len(ws))
	for i := range ws {
		out[i] = Proto(&ws[i])
	}
	return out, nil
}

// Proto converts a row.
func Proto(w *store.Workspace) *cohortv1.Workspace {
	out := &cohortv1.Workspace{
		Id: w.ID, Name: w.Name, Slug: w.Slug, Description: w.Description,
		DefaultTextModel: w.DefaultTextModel, DefaultImageModel: w.DefaultImageModel,
		DefaultProviderSort:             w.DefaultProviderSort,
		IoLoggingSamplingRate:           w.IOLoggingSamplingRate,
		IsDataDiscountLoggingEnabled:    w.IsDataDiscountLoggingEnabled,
		IsObservabilityBroadcastEnabled: w.IsObservabilityBroadcastEnabled,
		IsObservabilityIoLoggingEnabled: w.IsObservabilityIOLoggingEnabled,
		CreatedAt:                       timestamppb.New(w.CreatedAt),
		CreatedBy:                       w.CreatedBy,
	}
	if w.IOLoggingAPIKeyIDs != nil {
		var ids []string
		_ = json.Unmarshal([]byte(*w.IOLoggingAPIKeyIDs), &ids)
		out.IoLoggingApiKeyIds = &cohortv1.ApiKeyIds{Ids: ids}
	}
	if w.DefaultGuardrailID != "" {
		out.DefaultGuardrailId = &w.DefaultGuardrailID
	}
	if w.UpdatedAt != nil {
		out.UpdatedAt = timestamppb.New(*w.UpdatedAt)
	}
	return out
}
