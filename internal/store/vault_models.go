package store

import (
	"time"

	"github.com/uptrace/bun"
)

// Vault scope kinds: whose vault it is. Each intern has its own vault; the
// workspace kind is reserved for workspace vaults.
const (
	VaultScopeIntern    = "intern"
	VaultScopeWorkspace = "workspace"
)

// Vault holds one owner's data keys, wrapped by the key-encryption key and
// bound (associated data) to the vault's id, scope kind and owner.
type Vault struct {
	bun.BaseModel `bun:"table:vaults"`

	ID             string `bun:"id,pk"`
	OrganizationID string `bun:"organization_id,notnull"`
	ScopeKind      string `bun:"scope_kind,notnull"`
	OwnerID        string `bun:"owner_id,notnull"`
	// DataKeyset is the AEAD keyset that encrypts the values; MACKeyset the
	// HMAC-SHA-256 keyset of the fingerprints. Both are Tink encrypted
	// keysets (binary), wrapped by the KEK.
	DataKeyset  []byte     `bun:"data_keyset,notnull"`
	MACKeyset   []byte     `bun:"mac_keyset,notnull"`
	CreatedAt   time.Time  `bun:"created_at,notnull"`
	RewrappedAt *time.Time `bun:"rewrapped_at"`
}

// VaultSecret is one stored secret. Hosts (a JSON array) and Fingerprint are
// NULL only on legacy rows written before host binding.
type VaultSecret struct {
	bun.BaseModel `bun:"table:vault_secrets"`

	VaultID     string     `bun:"vault_id,pk"`
	Name        string     `bun:"name,pk"`
	Ciphertext  []byte     `bun:"ciphertext,notnull"`
	Hosts       *string    `bun:"hosts"`
	Fingerprint *string    `bun:"fingerprint"`
	CreatedAt   time.Time  `bun:"created_at,notnull"`
	UpdatedAt   *time.Time `bun:"updated_at"`
}

// VaultRelease is the audit of one release decision: who asked for which
// secret to go to which host, when, and what the vault answered. It never
// holds the value.
type VaultRelease struct {
	bun.BaseModel `bun:"table:vault_releases"`

	ID             string  `bun:"id,pk"`
	OrganizationID *string `bun:"organization_id"`
	InternID       string  `bun:"intern_id,notnull"`
	VaultID        *string `bun:"vault_id"`
	// VaultScope is the scope kind of the vault that answered (intern or
	// workspace); empty when none did.
	VaultScope string `bun:"vault_scope,notnull"`
	// RunID is the daemon run whose tool asked, when there is one.
	RunID      *string   `bun:"run_id"`
	SecretName string    `bun:"secret_name,notnull"`
	Host       string    `bun:"host,notnull"`
	Outcome    string    `bun:"outcome,notnull"`
	Reason     string    `bun:"reason,notnull"`
	Actor      string    `bun:"actor,notnull"`
	CreatedAt  time.Time `bun:"created_at,notnull"`
}

// ProxyCA is the gateway's proxy CA (ADR 0932): its certificate, which
// jails trust, and its PKCS #8 private key wrapped by the KEK, bound to the
// row's id. ID "current" is the one in use.
type ProxyCA struct {
	bun.BaseModel `bun:"table:proxy_cas"`

	ID         string    `bun:"id,pk"`
	CertPEM    string    `bun:"cert_pem,notnull"`
	WrappedKey []byte    `bun:"wrapped_key,notnull"`
	NotAfter   time.Time `bun:"not_after,notnull"`
	CreatedAt  time.Time `bun:"created_at,notnull"`
}
