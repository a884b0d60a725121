package store

import (
	"time"

	"github.com/uptrace/bun"
)

// FederationIssuer is an identity provider an organization trusts.
// Revision grows on every change, so that caches keyed by it (the issuer's
// JWKS key store) notice the change on any replica.
type FederationIssuer struct {
	bun.BaseModel `bun:"table:federation_issuers"`

	ID             string     `bun:"id,pk"`
	OrganizationID string     `bun:"organization_id,notnull"`
	Name           string     `bun:"name,notnull"`
	IssuerURL      string     `bun:"issuer_url,notnull"`
	JWKSURL        string     `bun:"jwks_url,notnull"`
	Revision       int64      `bun:"revision,notnull"`
	CreatedAt      time.Time  `bun:"created_at,notnull"`
	UpdatedAt      *time.Time `bun:"updated_at"`
}

// FederationPolicy lets one issuer's tokens be exchanged for access tokens
// acting as one workspace key. A claim check of a kind is held in its own
// column, so each kind exists at most once.
type FederationPolicy struct {
	bun.BaseModel `bun:"table:federation_policies"`

	ID             string     `bun:"id,pk"`
	OrganizationID string     `bun:"organization_id,notnull"`
	IssuerID       string     `bun:"issuer_id,notnull"`
	Subject        string     `bun:"subject,notnull"`
	Audience       string     `bun:"audience,notnull"`
	Condition      string     `bun:"condition_expr,notnull"`
	APIKeyID       string     `bun:"api_key_id,notnull"`
	Enabled        bool       `bun:"enabled,notnull"`
	ScopesCheck    *string    `bun:"scopes_check"`
	TokenTypeCheck *string    `bun:"token_type_check"`
	CreatedAt      time.Time  `bun:"created_at,notnull"`
	UpdatedAt      *time.Time `bun:"updated_at"`
}

// FederationExchange is one audited token exchange. It never holds a token.
type FederationExchange struct {
	bun.BaseModel `bun:"table:federation_exchanges"`

	ID             string    `bun:"id,pk"`
	OrganizationID string    `bun:"organization_id,notnull"`
	PolicyID       string    `bun:"policy_id,notnull"`
	IssuerID       string    `bun:"issuer_id,notnull"`
	At             time.Time `bun:"at,notnull"`
	Outcome        string    `bun:"outcome,notnull"`
	FailedCheck    string    `bun:"failed_check,notnull"`
	Detail         string    `bun:"detail,notnull"`
	Subject        string    `bun:"subject,notnull"`
	SourceAddress  string    `bun:"source_address,notnull"`
	TokenID        string    `bun:"token_id,notnull"`
	APIKeyID       string    `bun:"api_key_id,notnull"`
}

// SigningKey is an ES256 key that signs access tokens. It signs during
// [SignFrom, SignUntil) and is published until PublishUntil, when every
// token it signed has expired. The private key is wrapped by the KEK.
type SigningKey struct {
	bun.BaseModel `bun:"table:signing_keys"`

	ID                string    `bun:"id,pk"`
	Generation        int64     `bun:"generation,notnull"`
	Algorithm         string    `bun:"algorithm,notnull"`
	PublicKey         string    `bun:"public_key,notnull"`
	PrivateKeyWrapped string    `bun:"private_key_wrapped,notnull"`
	SignFrom          time.Time `bun:"sign_from,notnull"`
	SignUntil         time.Time `bun:"sign_until,notnull"`
	PublishUntil      time.Time `bun:"publish_until,notnull"`
	CreatedAt         time.Time `bun:"created_at,notnull"`
}
