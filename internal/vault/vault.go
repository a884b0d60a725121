// Package vault stores secrets for interns, encrypted at rest under a data
// key of their own vault (envelope encryption: the data keys are wrapped by
// the service's key-encryption key), fingerprints them, and releases a value
// only to one of the exact hosts it is bound to, auditing every decision.
//
// A value enters through Put (REST and Connect doors) and leaves only
// through ReleaseSecret, an internal call. It never reaches a response, an
// error or a log line.
package vault

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
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
	"github.com/cohort-dev/cohort/internal/store"
)

// Bounds from the spec's Limits table, and the REST body bound other
// deployments use.
const (
	MaxName      = 255    // characters in a secret name
	MaxHosts     = 100    // entries in hosts
	MaxHostField = 254    // characters in one hosts entry as sent
	MaxValue     = 65536  // characters (not bytes) in a value
	MaxBody      = 425000 // bytes in a REST or Connect request body
)

// Release outcomes recorded in the audit.
const (
	OutcomeReleased = "released"
	OutcomeRefused  = "refused"
)

// Service implements the vault.
type Service struct {
	DB      *bun.DB
	KEK     *envelope.KEK
	Interns *interns.Service
	Now     func() time.Time
	// RegionalHosts are Host header values (names, any case, with or
	// without port) on which every vault request is refused: secrets are
	// only handled on the global hostname.
	RegionalHosts []string
	// Observe, when set, counts writes ("write", "stored") and release
	// decisions ("release", "released"|"refused") (internal/metrics).
	Observe func(event, outcome string)

	keys keyCache
}

func (s *Service) observe(event, outcome string) {
	if s.Observe != nil {
		s.Observe(event, outcome)
	}
}

func (s *Service) now() time.Time { return store.Now(s.Now) }

// Admit applies the gates every vault request passes before anything else
// is read: the interns programme (the plain 404), the regional hostname
// refusal (403), the key's scope (403), and for writes the organization's
// vault-writes switch (503). It is the vault routes' declared caller check
// (internal/server), run once per request on both doors before a body is
// read, so a caller outside the programme learns nothing about the route;
// the operations below take a principal it admitted. Federation access
// tokens never get here (auth: they carry the inference scope only).
func (s *Service) Admit(p *auth.Principal, requestHost string, write bool) error {
	if p == nil {
		return apierr.Unauthenticated("missing API key")
	}
	if err := interns.CheckProgramme(p); err != nil {
		return err
	}
	if len(s.RegionalHosts) > 0 {
		h := hostHeader(requestHost)
		for _, r := range s.RegionalHosts {
			if hostHeader(r) == h {
				return apierr.New(http.StatusForbidden, apierr.ReasonRegionalHost,
					"the vault is not available on regional hostname %q: use the global API hostname", h)
			}
		}
	}
	switch {
	case p.KeyKind != store.KeyWorkspace && p.KeyKind != store.KeyPersonal:
		return apierr.New(http.StatusForbidden, apierr.ReasonForbidden,
			"a %s key selects no workspace: vault routes act on the workspace of a workspace key or a personal key's active workspace", p.KeyKind)
	case p.WorkspaceID == "":
		return apierr.New(http.StatusForbidden, apierr.ReasonForbidden, "this key has no active workspace")
	case p.Departed():
		return apierr.New(http.StatusForbidden, apierr.ReasonForbidden, "the key's creator has left the organization and holds no grant")
	}
	if write && !p.VaultWrites {
		return apierr.New(http.StatusServiceUnavailable, apierr.ReasonVaultWritesDisabled, "vault writes are disabled for this organization")
	}
	return nil
}

// CheckName enforces the spec's secret-name rule: 1 to 255 characters,
// lowercase letters, digits and single underscores, starting with a letter
// and not ending with an underscore (the spec's pattern
// ^(?!.*__)[a-z]([a-z0-9_]*[a-z0-9])?$, whose lookahead Go's regexp lacks).
func CheckName(name string) error {
	switch {
	case name == "":
		return apierr.BadRequest("name must be 1 to %d characters", MaxName)
	case len(name) > MaxName:
		// Longer in bytes than the bound; any valid name is ASCII, so this
		// is also longer in characters or not a valid name at all.
		return apierr.BadRequest("name must be 1 to %d characters", MaxName)
	case name[0] < 'a' || name[0] > 'z':
		return apierr.BadRequest("name must start with a lowercase letter")
	case name[len(name)-1] == '_':
		return apierr.BadRequest("name must not end with an underscore")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return apierr.BadRequest("name may hold only lowercase letters, digits and underscores")
		}
		if c == '_' && i > 0 && name[i-1] == '_' {
			return apierr.BadRequest("name must not hold two underscores in a row")
		}
	}
	return nil
}

// NormalizeHosts applies NormalizeHost to every entry of a hosts field,
// enforces the field's bounds, and collapses duplicates (first occurrence
// kept). The error names the entry by index.
func NormalizeHosts(in []string) ([]string, error) {
	if len(in) == 0 || len(in) > MaxHosts {
		return nil, apierr.BadRequest("hosts must have 1 to %d entries, got %d", MaxHosts, len(in))
	}
	out := make([]string, 0, len(in))
	seen := make(map[string]bool, len(in))
	for i, raw := range in {
		if n := utf8.RuneCountInString(raw); n > MaxHostField {
			return nil, apierr.BadRequest("hosts[%d] is %d characters long: at most %d", i, n, MaxHostField)
		}
		h, err := NormalizeHost(raw)
		if err != nil {
			return nil, apierr.BadRequest("hosts[%d] %s: %v", i, quote(raw), err)
		}
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out, nil
}

// quote shows a rejected entry safely: escaped (invisible characters become
// visible) and cut to a readable length.
func quote(s string) string {
	const max = 80
	if utf8.RuneCountInString(s) > max {
		r := []rune(s)
		return strconv.QuoteToASCII(string(r[:max])) + "…"
	}
	return strconv.QuoteToASCII(s)
}

func checkValue(v string) error {
	if n := utf8.RuneCountInString(v); n == 0 || n > MaxValue {
		// Never the value itself, not even a piece of it.
		return apierr.BadRequest("value must be 1 to %d characters, got %d", MaxValue, n)
	}
	return nil
}

// parseInternID accepts a UUID in its 36-character form, any case, and
// returns it canonical (lowercase), as intern ids are stored.
func parseInternID(s string) (string, error) {
	u, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return "", apierr.BadRequest("intern id must be a UUID")
	}
	return u.String(), nil
}

// Put creates or replaces the secret req.Name in the vault of intern
// req.InternId, bound to req.Hosts, for a principal admitted to write
// (Admit). The response carries metadata only. Nothing is written unless
// every check passes.
func (s *Service) Put(ctx context.Context, p *auth.Principal, req *cohortv1.PutInternSecretRequest) (*cohortv1.PutInternSecretResponse, error) {
	internID, err := parseInternID(req.GetInternId())
	if err != nil {
		return nil, err
	}
	in, err := s.checkPut(req.GetName(), req.GetHosts(), req.GetValue())
	if err != nil {
		return nil, err
	}
	intern, err := s.Interns.Load(ctx, p, internID)
	if err != nil {
		return nil, err
	}
	row, created, err := s.put(ctx, intern.OrganizationID, store.VaultScopeIntern, intern.ID, in)
	if err != nil {
		return nil, err
	}
	s.observe("write", "stored")
	return &cohortv1.PutInternSecretResponse{Secret: metadata(row), Created: created}, nil
}

// PutWorkspace creates or replaces a secret in the vault of the workspace
// the key selects (each workspace has its own vault and keys).
func (s *Service) PutWorkspace(ctx context.Context, p *auth.Principal, req *cohortv1.PutWorkspaceSecretRequest) (*cohortv1.PutWorkspaceSecretResponse, error) {
	in, err := s.checkPut(req.GetName(), req.GetHosts(), req.GetValue())
	if err != nil {
		return nil, err
	}
	row, created, err := s.put(ctx, p.OrganizationID, store.VaultScopeWorkspace, p.WorkspaceID, in)
	if err != nil {
		return nil, err
	}
	s.observe("write", "stored")
	return &cohortv1.PutWorkspaceSecretResponse{Secret: metadata(row), Created: created}, nil
}

// putInput is a checked secret to store.
type putInput struct {
	name  string
	hosts []string
	value string
}

func (s *Service) checkPut(name string, rawHosts []string, value string) (*putInput, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	hosts, err := NormalizeHosts(rawHosts)
	if err != nil {
		return nil, err
	}
	if err := checkValue(value); err != nil {
		return nil, err
	}
	return &putInput{name: name, hosts: hosts, value: value}, nil
}

// put seals and stores a checked secret in the owner's vault (created on
// first use) and reports whether it was new.
func (s *Service) put(ctx context.Context, orgID, scope, owner string, in *putInput) (*store.VaultSecret, bool, error) {
	v, kr, err := s.ownerVault(ctx, orgID, scope, owner)
	if err != nil {
		return nil, false, err
	}
	vb := []byte(in.value)
	ct, err := kr.Seal(v.ID, in.name, in.hosts, vb)
	if err != nil {
		return nil, false, apierr.Internal(fmt.Errorf("seal secret in vault %s: %w", v.ID, err))
	}
	fp, err := kr.Fingerprint(vb)
	if err != nil {
		return nil, false, apierr.Internal(fmt.Errorf("fingerprint in vault %s: %w", v.ID, err))
	}
	hj := hostsJSON(in.hosts)
	now := s.now()
	row := &store.VaultSecret{VaultID: v.ID, Name: in.name, Ciphertext: ct, Hosts: &hj, Fingerprint: &fp, CreatedAt: now}
	// One statement creates or replaces. A replace keeps created_at and
	// sets updated_at, which tells the two apart.
	err = s.DB.NewInsert().Model(row).
		On("CONFLICT (vault_id, name) DO UPDATE").
		Set("ciphertext = EXCLUDED.ciphertext").
		Set("hosts = EXCLUDED.hosts").
		Set("fingerprint = EXCLUDED.fingerprint").
		Set("updated_at = ?", now).
		Returning("created_at, updated_at").
		Scan(ctx)
	if err != nil {
		return nil, false, apierr.Internal(fmt.Errorf("store secret in vault %s: %w", v.ID, err))
	}
	return row, row.UpdatedAt == nil, nil
}

// Metadata returns a stored secret's metadata (legacy rows included, with
// no hosts and no fingerprint), for a principal admitted to read (Admit
// with write false: writes may be disabled).
func (s *Service) Metadata(ctx context.Context, p *auth.Principal, internID, name string) (*cohortv1.SecretMetadata, error) {
	id, err := parseInternID(internID)
	if err != nil {
		return nil, err
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	in, err := s.Interns.Load(ctx, p, id)
	if err != nil {
		return nil, err
	}
	v, err := s.findVault(ctx, store.VaultScopeIntern, in.ID)
	if err != nil {
		return nil, err
	}
	row, err := s.findSecret(ctx, v, name)
	if err != nil {
		return nil, err
	}
	return metadata(row), nil
}

func metadata(row *store.VaultSecret) *cohortv1.SecretMetadata {
	m := &cohortv1.SecretMetadata{Name: row.Name, Fingerprint: row.Fingerprint, CreatedAt: timestamppb.New(row.CreatedAt)}
	if row.Hosts != nil {
		// A row whose hosts do not parse has none: it is never released.
		json.Unmarshal([]byte(*row.Hosts), &m.Hosts) //nolint:errcheck
	}
	return m
}

var errSecretNotFound = apierr.NotFound("secret not found")

// findVault returns the owner's vault, or a 404 for the secret when the
// owner has none yet.
func (s *Service) findVault(ctx context.Context, scope, owner string) (*store.Vault, error) {
	var v store.Vault
	err := s.DB.NewSelect().Model(&v).Where("scope_kind = ? AND owner_id = ?", scope, owner).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errSecretNotFound
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return &v, nil
}

func (s *Service) findSecret(ctx context.Context, v *store.Vault, name string) (*store.VaultSecret, error) {
	var row store.VaultSecret
	err := s.DB.NewSelect().Model(&row).Where("vault_id = ? AND name = ?", v.ID, name).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errSecretNotFound
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return &row, nil
}

// ownerVault returns the owner's vault and its keys, creating the vault
// (with fresh keys) on first use.
func (s *Service) ownerVault(ctx context.Context, orgID, scope, owner string) (*store.Vault, *Keyring, error) {
	v, err := s.findVault(ctx, scope, owner)
	if err == errSecretNotFound {
		var kr *Keyring
		if v, kr, err = s.createVault(ctx, orgID, scope, owner); kr != nil || err != nil {
			return v, kr, err
		}
		// A concurrent request created it first: use theirs.
		v, err = s.findVault(ctx, scope, owner)
	}
	if err != nil {
		return nil, nil, err
	}
	if v.OrganizationID != orgID {
		return nil, nil, apierr.Bug("vault %s belongs to another organization than its owner", v.ID)
	}
	kr, err := s.keyring(v)
	if err != nil {
		return nil, nil, apierr.Internal(err)
	}
	return v, kr, nil
}

// createVault makes the owner's vault with fresh keys. It returns no
// keyring and no error when another request created the vault first.
func (s *Service) createVault(ctx context.Context, orgID, scope, owner string) (*store.Vault, *Keyring, error) {
	v := &store.Vault{ID: uuid.NewString(), OrganizationID: orgID, ScopeKind: scope, OwnerID: owner, CreatedAt: s.now()}
	kr, err := NewKeyring(s.KEK, v)
	if err != nil {
		return nil, nil, apierr.Internal(fmt.Errorf("new vault keys: %w", err))
	}
	res, err := s.DB.NewInsert().Model(v).On("CONFLICT (scope_kind, owner_id) DO NOTHING").Exec(ctx)
	if err != nil {
		return nil, nil, apierr.Internal(fmt.Errorf("create vault: %w", err))
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return nil, nil, nil
	}
	s.keys.put(v, kr)
	return v, kr, nil
}

// keyring returns v's unwrapped keys, from the cache when the wrapped
// keysets are the ones the cache opened.
func (s *Service) keyring(v *store.Vault) (*Keyring, error) {
	if kr := s.keys.get(v); kr != nil {
		return kr, nil
	}
	kr, err := OpenKeyring(s.KEK, v)
	if err != nil {
		return nil, err
	}
	s.keys.put(v, kr)
	return kr, nil
}

// keyCache keeps unwrapped keyrings so a write does not unwrap two keysets
// every time. An entry is used only while the row's wrapped keysets are
// byte for byte the ones it was opened from: a re-wrap or a swapped keyset
// makes it open again (and a swapped one then fails).
type keyCache struct {
	mu sync.Mutex
	m  map[string]cachedKeys
}

type cachedKeys struct {
	data, mac []byte
	kr        *Keyring
}

// maxCachedVaults bounds the cache; past it an arbitrary entry goes.
const maxCachedVaults = 4096

func (c *keyCache) get(v *store.Vault) *Keyring {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[v.ID]
	if !ok || !bytes.Equal(e.data, v.DataKeyset) || !bytes.Equal(e.mac, v.MACKeyset) {
		return nil
	}
	return e.kr
}

func (c *keyCache) put(v *store.Vault, kr *Keyring) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]cachedKeys)
	}
	if _, ok := c.m[v.ID]; !ok && len(c.m) >= maxCachedVaults {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[v.ID] = cachedKeys{data: bytes.Clone(v.DataKeyset), mac: bytes.Clone(v.MACKeyset), kr: kr}
}

// RewrapAll re-wraps the data keys of every vault under the KEK's current
// primary key (after envelope.Rotate added one) and returns how many vaults
// it re-wrapped. Ciphertexts and fingerprints are untouched: the data keys
// themselves do not change. It works page by page and each vault is one
// small update, so servers keep running meanwhile; both the old and the new
// wrapping open with the rotated KEK file.
func (s *Service) RewrapAll(ctx context.Context) (int64, error) {
	const page = 100
	var n int64
	last := ""
	for {
		var vs []store.Vault
		if err := s.DB.NewSelect().Model(&vs).Where("id > ?", last).Order("id").Limit(page).Scan(ctx); err != nil {
			return n, err
		}
		for i := range vs {
			v := &vs[i]
			if err := Rewrap(s.KEK, v); err != nil {
				return n, err
			}
			now := s.now()
			_, err := s.DB.NewUpdate().Model((*store.Vault)(nil)).
				Set("data_keyset = ?", v.DataKeyset).Set("mac_keyset = ?", v.MACKeyset).Set("rewrapped_at = ?", now).
				Where("id = ?", v.ID).Exec(ctx)
			if err != nil {
				return n, fmt.Errorf("vault %s: %w", v.ID, err)
			}
			n++
		}
		if len(vs) < page {
			return n, RewrapProxyCA(ctx, s.DB, s.KEK)
		}
		last = vs[len(vs)-1].ID
	}
}
