package workspaces

import (
	"net/http"
	"time"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/rest"
)

// MaxBody bounds a create request; the largest valid body is far smaller.
const MaxBody = 64 << 10

// createBody is the REST request. Pointers tell omitted fields from zero
// values; a JSON null counts as omitted.
type createBody struct {
	Name                            *string   `json:"name"`
	Slug                            *string   `json:"slug"`
	Description                     *string   `json:"description"`
	DefaultTextModel                *string   `json:"default_text_model"`
	DefaultImageModel               *string   `json:"default_image_model"`
	DefaultProviderSort             *string   `json:"default_provider_sort"`
	IOLoggingAPIKeyIDs              *[]string `json:"io_logging_api_key_ids"`
	IOLoggingSamplingRate           *float64  `json:"io_logging_sampling_rate"`
	IsDataDiscountLoggingEnabled    *bool     `json:"is_data_discount_logging_enabled"`
	IsObservabilityBroadcastEnabled *bool     `json:"is_observability_broadcast_enabled"`
	IsObservabilityIOLoggingEnabled *bool     `json:"is_observability_io_logging_enabled"`
}

// JSON is the spec's workspace object, every field present.
type JSON struct {
	ID                              string    `json:"id"`
	Name                            string    `json:"name"`
	Slug                            string    `json:"slug"`
	Description                     string    `json:"description"`
	DefaultTextModel                string    `json:"default_text_model"`
	DefaultImageModel               string    `json:"default_image_model"`
	DefaultProviderSort             string    `json:"default_provider_sort"`
	DefaultGuardrailID              *string   `json:"default_guardrail_id"`
	IOLoggingAPIKeyIDs              *[]string `json:"io_logging_api_key_ids"`
	IOLoggingSamplingRate           float64   `json:"io_logging_sampling_rate"`
	IsDataDiscountLoggingEnabled    bool      `json:"is_data_discount_logging_enabled"`
	IsObservabilityBroadcastEnabled bool      `json:"is_observability_broadcast_enabled"`
	IsObservabilityIOLoggingEnabled bool      `json:"is_observability_io_logging_enabled"`
	CreatedAt                       string    `json:"created_at"`
	CreatedBy                       string    `json:"created_by"`
	UpdatedAt                       *string   `json:"updated_at"`
}

// ToJSON renders a workspace as the spec's object.
func ToJSON(w *cohortv1.Workspace) JSON {
	out := JSON{
		ID: w.GetId(), Name: w.GetName(), Slug: w.GetSlug(), Description: w.GetDescription(),
		DefaultTextModel: w.GetDefaultTextModel(), DefaultImageModel: w.GetDefaultImageModel(),
		DefaultProviderSort: w.GetDefaultProviderSort(), DefaultGuardrailID: w.DefaultGuardrailId,
		IOLoggingSamplingRate:           w.GetIoLoggingSamplingRate(),
		IsDataDiscountLoggingEnabled:    w.GetIsDataDiscountLoggingEnabled(),
		IsObservabilityBroadcastEnabled: w.GetIsObservabilityBroadcastEnabled(),
		IsObservabilityIOLoggingEnabled: w.GetIsObservabilityIoLoggingEnabled(),
		CreatedAt:                       w.GetCreatedAt().AsTime().Format(time.RFC3339Nano),
		CreatedBy:                       w.GetCreatedBy(),
	}
	if w.IoLoggingApiKeyIds != nil {
		ids := append([]string{}, w.IoLoggingApiKeyIds.GetIds()...)
		out.IOLoggingAPIKeyIDs = &ids
	}
	if w.UpdatedAt != nil {
		s := w.UpdatedAt.AsTime().Format(time.RFC3339Nano)
		out.UpdatedAt = &s
	}
	return out
}

// REST is the REST door: POST /api/v1/workspaces. The caller was
// authenticated where the route is declared (internal/server).
type REST struct {
	S *Service
}

// Create handles POST /api/v1/workspaces and answers 201 {"data": workspace}.
func (h REST) Create(w http.ResponseWriter, r *http.Request) {
	p := auth.From(r.Context())
	body, err := rest.ReadBody(w, r, MaxBody, apierr.ReasonPayloadTooLarge)
	if err != nil {
		rest.WriteError(w, r, err, false)
		return
	}
	var b createBody
	if err := rest.DecodeStrict(body, &b); err != nil {
		rest.WriteError(w, r, err, false)
		return
	}
	req := &cohortv1.CreateWorkspaceRequest{
		Name: b.Name, Slug: b.Slug, Description: b.Description,
		DefaultTextModel: b.DefaultTextModel, DefaultImageModel: b.DefaultImageModel,
		DefaultProviderSort: b.DefaultProviderSort, IoLoggingSamplingRate: b.IOLoggingSamplingRate,
		IsDataDiscountLoggingEnabled:    b.IsDataDiscountLoggingEnabled,
		IsObservabilityBroadcastEnabled: b.IsObservabilityBroadcastEnabled,
		IsObservabilityIoLoggingEnabled: b.IsObservabilityIOLoggingEnabled,
	}
	if b.IOLoggingAPIKeyIDs != nil {
		req.IoLoggingApiKeyIds = &cohortv1.ApiKeyIds{Ids: *b.IOLoggingAPIKeyIDs}
	}
	ws, err := h.S.Create(r.Context(), p, req)
	if err != nil {
		rest.WriteError(w, r, err, false)
		return
	}
	rest.WriteJSON(w, http.StatusCreated, map[string]any{"data": ToJSON(ws)})
}
