// Package webhooks sends a workspace's run events to the endpoints it
// registered, signed as Standard Webhooks define (sign.go), at least once
// from a durable outbox in the database (outbox.go, worker.go), through the
// egress policy identity provider fetches follow (egress.go). Service is
// the one implementation of the endpoint management; the Connect and REST
// doors (connect.go, rest.go) and the CLI decode, call it and encode.
package webhooks

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"google.golang.org/protobuf/types/known/timestamppb"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/store"
)

// Event types: a run's status changes.
const (
	RunPaused    = "run.paused"
	RunCompleted = "run.completed"
	RunFailed    = "run.failed"
	RunCancelled = "run.cancelled"
)

// EventTypes are every event type, in the order documented.
var EventTypes = []string{RunPaused, RunCompleted, RunFailed, RunCancelled}

// Bounds.
const (
	MaxDescription = 500
	// MaxEndpoints bounds a workspace's endpoints (each event is one
	// outbox row per endpoint).
	MaxEndpoints = 20
	// MaxBody bounds a management request's body.
	MaxBody = 64 << 10
	// RotationGrace is how long deliveries carry a signature by the
	// previous secret after a rotation.
	RotationGrace = 24 * time.Hour
)

// Service manages endpoints and reads the delivery log.
type Service struct {
	DB  *bun.DB
	KEK *envelope.KEK
	// Allow is --webhook-allow-hosts.
	Allow *safehttp.Allowlist
	Log   *slog.Logger
	// Now is the clock (tests); nil is the wall clock.
	Now func() time.Time
	// Wake, when set, is called after a redelivery so a local worker
	// attempts it at once.
	Wake func()
}

func (s *Service) now() time.Time { return store.Now(s.Now) }

// Notify tells this replica's worker that deliveries were enqueued: the
// runs code calls it after the transaction that called RunChanged
// commits, so a delivery starts at once rather than at the next poll.
func (s *Service) Notify() {
	if s != nil && s.Wake != nil {
		s.Wake()
	}
}

// secretAD binds a wrapped secret to its endpoint: a ciphertext copied to
// another row does not unwrap.
func secretAD(endpointID string) []byte { return []byte("cohort webhook secret " + endpointID) }

// workspaceFor is the gate of every call: the interns programme (runs are
// interns' runs), a creator who has not left, and the workspace the call
// acts on (a management key names it; other keys act on their own).
func (s *Service) workspaceFor(ctx context.Context, p *auth.Principal, named string) (string, error) {
	if err := interns.CheckProgramme(p); err != nil {
		return "", err
	}
	if p.Departed() {
		return "", interns.ErrDeparted
	}
	if named != "" && !plainID(named) {
		return "", apierr.NotFound("workspace %q not found", clip(named))
	}
	return interns.WorkspaceFor(ctx, s.DB, p, named)
}

// plainID reports whether id can name a row: ids are short and of
// letters, digits, '_' and '-' (uuids, whep_…, msg_…); anything else is
// not found without asking the database (a NUL is an error to PostgreSQL).
func plainID(id string) bool {
	if id == "" || len(id) > 100 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// endpoint loads an endpoint the caller may see; any other is 404.
func (s *Service) endpoint(ctx context.Context, p *auth.Principal, id string) (*store.WebhookEndpoint, error) {
	if err := interns.CheckProgramme(p); err != nil {
		return nil, err
	}
	if p.Departed() {
		return nil, interns.ErrDeparted
	}
	if !plainID(id) {
		return nil, apierr.NotFound("webhook endpoint %q not found", clip(id))
	}
	e := new(store.WebhookEndpoint)
	q := s.DB.NewSelect().Model(e).Where("id = ? AND organization_id = ?", id, p.OrganizationID)
	if !p.IsManagement() {
		if p.WorkspaceID == "" {
			return nil, apierr.Forbidden("this key has no active workspace")
		}
		q = q.Where("workspace_id = ?", p.WorkspaceID)
	}
	if err := q.Scan(ctx); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, apierr.NotFound("webhook endpoint %q not found", id)
		}
		return nil, apierr.Internal(err)
	}
	return e, nil
}

func checkEvents(events []string) (string, error) {
	if len(events) == 0 {
		return "", apierr.BadRequest("events must name at least one of %s", strings.Join(EventTypes, ", "))
	}
	var out []string
	for _, e := range events {
		if !slices.Contains(EventTypes, e) {
			return "", apierr.BadRequest("events: %q is not an event type; the types are %s", e, strings.Join(EventTypes, ", "))
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	b, _ := json.Marshal(out)
	return string(b), nil
}

func checkDescription(d string) error {
	if !utf8.ValidString(d) || utf8.RuneCountInString(d) > MaxDescription {
		return apierr.BadRequest("description must be at most %d characters", MaxDescription)
	}
	return nil
}

func (s *Service) checkURL(ctx context.Context, raw string) error {
	u, err := checkURLSyntax(raw)
	if err != nil {
		return err
	}
	return checkDestination(ctx, u, s.Allow)
}

// wrapSecret makes a new secret for endpoint id: its shown form and the
// KEK-wrapped key.
func (s *Service) newSecret(id string) (string, []byte, error) {
	if s.KEK == nil {
		return "", nil, apierr.Internal(errors.New("webhooks: no key-encryption key"))
	}
	secret, err := NewSecret()
	if err != nil {
		return "", nil, apierr.Internal(err)
	}
	wrapped, err := s.KEK.Wrap([]byte(secret), secretAD(id))
	if err != nil {
		return "", nil, apierr.Internal(err)
	}
	return secret, wrapped, nil
}

// Create registers an endpoint and shows its secret once.
func (s *Service) Create(ctx context.Context, p *auth.Principal, req *cohortv1.CreateWebhookEndpointRequest) (*cohortv1.CreateWebhookEndpointResponse, error) {
	ws, err := s.workspaceFor(ctx, p, req.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	events, err := checkEvents(req.GetEvents())
	if err != nil {
		return nil, err
	}
	if err := checkDescription(req.GetDescription()); err != nil {
		return nil, err
	}
	if err := s.checkURL(ctx, req.GetUrl()); err != nil {
		return nil, err
	}
	n, err := s.DB.NewSelect().Model((*store.WebhookEndpoint)(nil)).Where("workspace_id = ?", ws).Count(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if n >= MaxEndpoints {
		return nil, apierr.Conflict(apierr.ReasonTooManyEndpoints, "a workspace has at most %d webhook endpoints", MaxEndpoints)
	}
	id := "whep_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	secret, wrapped, err := s.newSecret(id)
	if err != nil {
		return nil, err
	}
	now := s.now()
	e := &store.WebhookEndpoint{ID: id, OrganizationID: p.OrganizationID, WorkspaceID: ws, URL: req.GetUrl(),
		Events: events, Description: req.GetDescription(), Enabled: req.Enabled == nil || *req.Enabled,
		Secret: wrapped, CreatedAt: now, UpdatedAt: now}
	if _, err := s.DB.NewInsert().Model(e).Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return &cohortv1.CreateWebhookEndpointResponse{Endpoint: toProto(e), Secret: secret}, nil
}

// Get returns an endpoint, never its secret.
func (s *Service) Get(ctx context.Context, p *auth.Principal, req *cohortv1.GetWebhookEndpointRequest) (*cohortv1.GetWebhookEndpointResponse, error) {
	e, err := s.endpoint(ctx, p, req.GetId())
	if err != nil {
		return nil, err
	}
	return &cohortv1.GetWebhookEndpointResponse{Endpoint: toProto(e)}, nil
}

// List returns a workspace's endpoints, oldest first.
func (s *Service) List(ctx context.Context, p *auth.Principal, req *cohortv1.ListWebhookEndpointsRequest) (*cohortv1.ListWebhookEndpointsResponse, error) {
	ws, err := s.workspaceFor(ctx, p, req.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	var es []store.WebhookEndpoint
	if err := s.DB.NewSelect().Model(&es).Where("workspace_id = ?", ws).Order("created_at", "id").Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	out := &cohortv1.ListWebhookEndpointsResponse{Endpoints: []*cohortv1.WebhookEndpoint{}}
	for i := range es {
		out.Endpoints = append(out.Endpoints, toProto(&es[i]))
	}
	return out, nil
}

// Update changes the fields set in req.
func (s *Service) Update(ctx context.Context, p *auth.Principal, req *cohortv1.UpdateWebhookEndpointRequest) (*cohortv1.UpdateWebhookEndpointResponse, error) {
	e, err := s.endpoint(ctx, p, req.GetId())
	if err != nil {
		return nil, err
	}
	if req.Url != nil {
		if err := s.checkURL(ctx, *req.Url); err != nil {
			return nil, err
		}
		e.URL = *req.Url
	}
	if len(req.GetEvents()) > 0 {
		if e.Events, err = checkEvents(req.GetEvents()); err != nil {
			return nil, err
		}
	}
	if req.Description != nil {
		if err := checkDescription(*req.Description); err != nil {
			return nil, err
		}
		e.Description = *req.Description
	}
	if req.Enabled != nil {
		e.Enabled = *req.Enabled
	}
	e.UpdatedAt = s.now()
	if _, err := s.DB.NewUpdate().Model(e).Column("url", "events", "description", "enabled", "updated_at").WherePK().Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return &cohortv1.UpdateWebhookEndpointResponse{Endpoint: toProto(e)}, nil
}

// Rotate replaces the signing secret and shows the new one once; the
// previous one still signs (beside it) for RotationGrace.
func (s *Service) Rotate(ctx context.Context, p *auth.Principal, req *cohortv1.RotateWebhookSecretRequest) (*cohortv1.RotateWebhookSecretResponse, error) {
	e, err := s.endpoint(ctx, p, req.GetId())
	if err != nil {
		return nil, err
	}
	secret, wrapped, err := s.newSecret(e.ID)
	if err != nil {
		return nil, err
	}
	now := s.now()
	until := now.Add(RotationGrace)
	e.PreviousSecret, e.PreviousUntil, e.Secret, e.SecretRotatedAt, e.UpdatedAt = e.Secret, &until, wrapped, &now, now
	if _, err := s.DB.NewUpdate().Model(e).Column("secret", "previous_secret", "previous_until", "secret_rotated_at", "updated_at").WherePK().Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return &cohortv1.RotateWebhookSecretResponse{Endpoint: toProto(e), Secret: secret}, nil
}

// Delete deletes an endpoint and its deliveries.
func (s *Service) Delete(ctx context.Context, p *auth.Principal, req *cohortv1.DeleteWebhookEndpointRequest) (*cohortv1.DeleteWebhookEndpointResponse, error) {
	e, err := s.endpoint(ctx, p, req.GetId())
	if err != nil {
		return nil, err
	}
	err = s.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if _, err := tx.NewDelete().Model((*store.WebhookDelivery)(nil)).Where("endpoint_id = ?", e.ID).Exec(ctx); err != nil {
			return err
		}
		_, err := tx.NewDelete().Model(e).WherePK().Exec(ctx)
		return err
	})
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return &cohortv1.DeleteWebhookEndpointResponse{}, nil
}

// Deliveries lists an endpoint's deliveries, newest first.
func (s *Service) Deliveries(ctx context.Context, p *auth.Principal, req *cohortv1.ListWebhookDeliveriesRequest) (*cohortv1.ListWebhookDeliveriesResponse, error) {
	e, err := s.endpoint(ctx, p, req.GetEndpointId())
	if err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size == 0:
		size = 50
	case size < 0 || size > 100:
		return nil, apierr.BadRequest("page_size must be 1 to 100")
	}
	q := s.DB.NewSelect().Model((*store.WebhookDelivery)(nil)).ExcludeColumn("payload").Where("endpoint_id = ?", e.ID)
	switch st := req.GetStatus(); st {
	case "":
	case store.WebhookPending, store.WebhookSucceeded, store.WebhookFailed:
		q = q.Where("status = ?", st)
	default:
		return nil, apierr.BadRequest("status must be pending, succeeded or failed")
	}
	var ds []store.WebhookDelivery
	if err := q.Order("created_at DESC", "id DESC").Limit(int64(size)).Scan(ctx, &ds); err != nil {
		return nil, apierr.Internal(err)
	}
	out := &cohortv1.ListWebhookDeliveriesResponse{Deliveries: []*cohortv1.WebhookDelivery{}}
	for i := range ds {
		out.Deliveries = append(out.Deliveries, deliveryProto(&ds[i]))
	}
	return out, nil
}

// Redeliver puts a delivery back in the outbox, due now, with a fresh
// retry schedule; its webhook-id stays the same.
func (s *Service) Redeliver(ctx context.Context, p *auth.Principal, req *cohortv1.RedeliverWebhookRequest) (*cohortv1.RedeliverWebhookResponse, error) {
	if err := interns.CheckProgramme(p); err != nil {
		return nil, err
	}
	if !plainID(req.GetId()) {
		return nil, apierr.NotFound("webhook delivery %q not found", clip(req.GetId()))
	}
	d := new(store.WebhookDelivery)
	if err := s.DB.NewSelect().Model(d).ExcludeColumn("payload").Where("id = ?", req.GetId()).Scan(ctx); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, apierr.NotFound("webhook delivery %q not found", req.GetId())
		}
		return nil, apierr.Internal(err)
	}
	if _, err := s.endpoint(ctx, p, d.EndpointID); err != nil {
		if e := apierr.From(err); e != nil && e.Status == 404 {
			return nil, apierr.NotFound("webhook delivery %q not found", req.GetId())
		}
		return nil, err
	}
	now := s.now()
	d.Status, d.Attempts, d.NextAttemptAt, d.LeaseOwner, d.LeaseUntil = store.WebhookPending, 0, now, nil, nil
	if _, err := s.DB.NewUpdate().Model(d).Column("status", "attempts", "next_attempt_at", "lease_owner", "lease_until").WherePK().Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	s.Notify()
	return &cohortv1.RedeliverWebhookResponse{Delivery: deliveryProto(d)}, nil
}

// clip bounds an id echoed in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func toProto(e *store.WebhookEndpoint) *cohortv1.WebhookEndpoint {
	var events []string
	json.Unmarshal([]byte(e.Events), &events)
	out := &cohortv1.WebhookEndpoint{Id: e.ID, WorkspaceId: e.WorkspaceID, Url: e.URL, Events: events,
		Description: e.Description, Enabled: e.Enabled,
		CreatedAt: timestamppb.New(e.CreatedAt), UpdatedAt: timestamppb.New(e.UpdatedAt)}
	if e.SecretRotatedAt != nil {
		out.SecretRotatedAt = timestamppb.New(*e.SecretRotatedAt)
	}
	return out
}

func deliveryProto(d *store.WebhookDelivery) *cohortv1.WebhookDelivery {
	out := &cohortv1.WebhookDelivery{Id: d.ID, EndpointId: d.EndpointID, EventType: d.EventType, Status: d.Status,
		Attempts: int32(d.Attempts), LastStatusCode: int32(d.LastStatusCode), LastError: d.LastError,
		CreatedAt: timestamppb.New(d.CreatedAt)}
	if d.Status == store.WebhookPending {
		out.NextAttemptAt = timestamppb.New(d.NextAttemptAt)
	}
	if d.DeliveredAt != nil {
		out.DeliveredAt = timestamppb.New(*d.DeliveredAt)
	}
	if d.LastAttemptAt != nil {
		out.LastAttemptAt = timestamppb.New(*d.LastAttemptAt)
	}
	return out
}
