package store

import (
	"time"

	"github.com/uptrace/bun"
)

// Webhook delivery statuses.
const (
	WebhookPending   = "pending"
	WebhookSucceeded = "succeeded"
	WebhookFailed    = "failed"
)

// WebhookEndpoint is an address that receives a workspace's run events.
// Secret (and PreviousSecret, kept for a grace period after a rotation)
// are the signing secrets wrapped by the KEK, bound to the endpoint's id.
type WebhookEndpoint struct {
	bun.BaseModel `bun:"table:webhook_endpoints"`

	ID             string `bun:"id,pk"`
	OrganizationID string `bun:"organization_id,notnull"`
	WorkspaceID    string `bun:"workspace_id,notnull"`
	URL            string `bun:"url,notnull"`
	// Events is a JSON array of event types.
	Events          string     `bun:"events,notnull"`
	Description     string     `bun:"description,notnull"`
	Enabled         bool       `bun:"enabled,notnull"`
	Secret          []byte     `bun:"secret,notnull"`
	PreviousSecret  []byte     `bun:"previous_secret"`
	PreviousUntil   *time.Time `bun:"previous_until"`
	SecretRotatedAt *time.Time `bun:"secret_rotated_at"`
	CreatedAt       time.Time  `bun:"created_at,notnull"`
	UpdatedAt       time.Time  `bun:"updated_at,notnull"`
}

// WebhookDelivery is one event to one endpoint: a row of the outbox.
// Payload is the exact body sent on every attempt.
type WebhookDelivery struct {
	bun.BaseModel `bun:"table:webhook_deliveries"`

	ID             string     `bun:"id,pk"`
	EndpointID     string     `bun:"endpoint_id,notnull"`
	WorkspaceID    string     `bun:"workspace_id,notnull"`
	EventType      string     `bun:"event_type,notnull"`
	Payload        string     `bun:"payload,notnull"`
	Status         string     `bun:"status,notnull"`
	Attempts       int        `bun:"attempts,notnull"`
	NextAttemptAt  time.Time  `bun:"next_attempt_at,notnull"`
	LeaseOwner     *string    `bun:"lease_owner"`
	LeaseUntil     *time.Time `bun:"lease_until"`
	LastStatusCode int        `bun:"last_status_code,notnull"`
	LastError      string     `bun:"last_error,notnull"`
	LastAttemptAt  *time.Time `bun:"last_attempt_at"`
	DeliveredAt    *time.Time `bun:"delivered_at"`
	CreatedAt      time.Time  `bun:"created_at,notnull"`
}
