package store

import (
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/config"
)

// Organization is a customer account and its entitlements.
type Organization struct {
	bun.BaseModel `bun:"table:organizations"`

	ID               string    `bun:"id,pk"`
	Name             string    `bun:"name,notnull"`
	InternsProgramme bool      `bun:"interns_programme,notnull"`
	WorkloadIdentity bool      `bun:"workload_identity,notnull"`
	VaultWrites      bool      `bun:"vault_writes,notnull"`
	CreatedAt        time.Time `bun:"created_at,notnull"`
}

// User is a person; memberships tie users to organizations.
type User struct {
	bun.BaseModel `bun:"table:users"`

	ID        string    `bun:"id,pk"`
	Email     string    `bun:"email,notnull"`
	Name      string    `bun:"name,notnull"`
	CreatedAt time.Time `bun:"created_at,notnull"`
}

// Membership is a user's place in an organization; LeftAt is set when the
// user leaves.
type Membership struct {
	bun.BaseModel `bun:"table:memberships"`

	OrganizationID string     `bun:"organization_id,pk"`
	UserID         string     `bun:"user_id,pk"`
	Role           string     `bun:"role,notnull"`
	JoinedAt       time.Time  `bun:"joined_at,notnull"`
	LeftAt         *time.Time `bun:"left_at"`
}

// Grant lets a user keep acting (through their keys) after leaving.
type Grant struct {
	bun.BaseModel `bun:"table:grants"`

	ID             string    `bun:"id,pk"`
	OrganizationID string    `bun:"organization_id,notnull"`
	UserID         string    `bun:"user_id,notnull"`
	WorkspaceID    *string   `bun:"workspace_id"`
	CreatedAt      time.Time `bun:"created_at,notnull"`
}

// Workspace is the spec's workspace record.
type Workspace struct {
	bun.BaseModel `bun:"table:workspaces"`

	ID                              string     `bun:"id,pk"`
	OrganizationID                  string     `bun:"organization_id,notnull"`
	Name                            string     `bun:"name,notnull"`
	Slug                            string     `bun:"slug,notnull"`
	Description                     string     `bun:"description,notnull"`
	DefaultTextModel                string     `bun:"default_text_model,notnull"`
	DefaultImageModel               string     `bun:"default_image_model,notnull"`
	DefaultProviderSort             string     `bun:"default_provider_sort,notnull"`
	DefaultGuardrailID              string     `bun:"default_guardrail_id,notnull"`
	IOLoggingAPIKeyIDs              *string    `bun:"io_logging_api_key_ids"` // JSON array, or NULL
	IOLoggingSamplingRate           float64    `bun:"io_logging_sampling_rate,notnull"`
	IsDataDiscountLoggingEnabled    bool       `bun:"is_data_discount_logging_enabled,notnull"`
	IsObservabilityBroadcastEnabled bool       `bun:"is_observability_broadcast_enabled,notnull"`
	IsObservabilityIOLoggingEnabled bool       `bun:"is_observability_io_logging_enabled,notnull"`
	CreatedAt                       time.Time  `bun:"created_at,notnull"`
	CreatedBy                       string     `bun:"created_by,notnull"`
	UpdatedAt                       *time.Time `bun:"updated_at"`
}

// API key kinds.
const (
	KeyManagement = "management"
	KeyWorkspace  = "workspace"
	KeyPersonal   = "personal"
)

// APIKey is a key's record. The key itself is never stored, only its hash.
type APIKey struct {
	bun.BaseModel `bun:"table:api_keys"`

	ID             string     `bun:"id,pk"`
	OrganizationID string     `bun:"organization_id,notnull"`
	WorkspaceID    *string    `bun:"workspace_id"`
	UserID         string     `bun:"user_id,notnull"`
	Kind           string     `bun:"kind,notnull"`
	Name           string     `bun:"name,notnull"`
	Prefix         string     `bun:"prefix,notnull"`
	Hash           string     `bun:"hash,notnull"`
	CreatedAt      time.Time  `bun:"created_at,notnull"`
	DisabledAt     *time.Time `bun:"disabled_at"`
	DeletedAt      *time.Time `bun:"deleted_at"`
}

// Intern states.
const (
	InternProvisioning = "provisioning"
	InternRunning      = "running"
	// InternSleeping: the local provisioner stopped the idle intern's jail;
	// its sessions stay on disk and the next turn wakes it.
	InternSleeping  = "sleeping"
	InternSuspended = "suspended"
	InternDeleted   = "deleted"
)

// Intern is a hosted agent's record.
type Intern struct {
	bun.BaseModel `bun:"table:interns"`

	ID             string `bun:"id,pk"`
	OrganizationID string `bun:"organization_id,notnull"`
	WorkspaceID    string `bun:"workspace_id,notnull"`
	Name           string `bun:"name,notnull"`
	Model          string `bun:"model,notnull"`
	// Agent names the intern's agent: "" or "cohort" is the built-in one,
	// other names are the operator's catalog (internal/agents).
	Agent     string     `bun:"agent,notnull"`
	State     string     `bun:"state,notnull"`
	CreatedBy string     `bun:"created_by,notnull"`
	CreatedAt time.Time  `bun:"created_at,notnull"`
	UpdatedAt *time.Time `bun:"updated_at"`
	// DaemonURL is where the intern's daemon listens (internal/provision).
	DaemonURL string `bun:"daemon_url,notnull"`
	// DaemonSecret is the daemon's secret wrapped by the KEK, base64.
	DaemonSecret string `bun:"daemon_secret,notnull"`
	// Provisioner is "local" or "remote", or "" before one took the intern.
	Provisioner string `bun:"provisioner,notnull"`
	// Limits are the intern's own bounds on its jail (columns limit_*).
	Limits config.InternLimits `bun:"embed:limit_"`
}
