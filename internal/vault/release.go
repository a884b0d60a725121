package vault

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/store"
)

// Audit reasons of release decisions.
const (
	ReasonHostMatch      = "host_match"       // released
	ReasonInvalidHost    = "invalid_host"     // destination is not a valid hostname
	ReasonInvalidName    = "invalid_name"     // name breaks the naming rule
	ReasonInternNotFound = "intern_not_found" // missing, deleted, or organization outside the programme
	ReasonSecretNotFound = "secret_not_found"
	ReasonUnbound        = "unbound"          // legacy row: no hosts, never released
	ReasonHostNotAllowed = "host_not_allowed" // destination is not one of the secret's hosts
	ReasonDecryptFailed  = "decrypt_failed"   // keys or ciphertext do not open: tampering or a swapped row
	ReasonInternal       = "internal_error"   // the database failed
)

// ReleaseSecret returns the value of the secret name of intern internID
// when destinationHost, normalized by NormalizeHost, is exactly one of the
// secret's hosts; see Release. The caller is taken from the principal in
// ctx, if any, for the audit.
func (s *Service) ReleaseSecret(ctx context.Context, internID, name, destinationHost string) (string, error) {
	return s.Release(ctx, ReleaseRequest{InternID: internID, Name: name, Host: destinationHost})
}

// ReleaseRequest asks for one secret for one request to one host.
type ReleaseRequest struct {
	InternID string
	Name     string
	// Host is the request's destination host, as the tool saw it.
	Host string
	// RunID is the daemon run whose tool asked ("" when none); audited.
	RunID string
	// Actor names who asked, for the audit; "" takes the principal in the
	// context (key:<id>), else "internal".
	Actor string

	// intern, when the caller already loaded the live intern row (with
	// whether its organization is in the programme), saves the lookup.
	intern    *store.Intern
	programme bool
}

// Release returns the value of the secret req.Name of intern req.InternID
// when req.Host, normalized by NormalizeHost, is exactly one of the
// secret's hosts: never a parent domain, never a sibling. The intern's own
// vault is looked up first; a name it does not hold is looked up in the
// vault of the intern's workspace. It is the only way a value leaves the
// vault. Every release and every refusal is recorded in the audit table
// (who, which secret, which host, which run, when, outcome; never the
// value) before it returns; if the audit cannot be written nothing is
// released. Legacy rows (no hosts) are never released.
func (s *Service) Release(ctx context.Context, req ReleaseRequest) (string, error) {
	rec := &store.VaultRelease{ID: uuid.NewString(), InternID: auditText(req.InternID), SecretName: auditText(req.Name),
		Host: auditText(req.Host), Actor: req.Actor, CreatedAt: s.now()}
	if rec.Actor == "" {
		rec.Actor = actor(ctx)
	}
	if req.RunID != "" {
		r := auditText(req.RunID)
		rec.RunID = &r
	}
	value, reason, err := s.release(ctx, rec, req)
	rec.Reason = reason
	rec.Outcome = OutcomeReleased
	if err != nil {
		rec.Outcome = OutcomeRefused
		value = ""
	}
	s.observe("release", rec.Outcome)
	// The audit is written even when the caller has gone: a decision
	// taken is a decision recorded.
	if _, aerr := s.DB.NewInsert().Model(rec).Exec(context.WithoutCancel(ctx)); aerr != nil {
		return "", apierr.Internal(fmt.Errorf("audit vault release: %w", aerr))
	}
	return value, err
}

func (s *Service) release(ctx context.Context, rec *store.VaultRelease, req ReleaseRequest) (string, string, error) {
	name := req.Name
	host, err := NormalizeHost(req.Host)
	if err != nil {
		return "", ReasonInvalidHost, apierr.BadRequest("destination host: %v", err)
	}
	rec.Host = host
	if err := CheckName(name); err != nil {
		return "", ReasonInvalidName, err
	}
	in, err := s.liveIntern(ctx, req)
	if err != nil {
		return "", ReasonInternal, apierr.Internal(err)
	}
	if in == nil {
		return "", ReasonInternNotFound, apierr.NotFound("intern not found")
	}
	rec.OrganizationID = &in.OrganizationID
	// The intern's own vault first, then its workspace's: one query
	// finds the name in both (a release is on every tool request's path).
	var found []foundSecret
	err = s.DB.NewSelect().Model(&found).
		ColumnExpr("?TableAlias.*").
		ColumnExpr("v.scope_kind AS v_scope_kind, v.organization_id AS v_organization_id, v.owner_id AS v_owner_id").
		ColumnExpr("v.data_keyset AS v_data_keyset, v.mac_keyset AS v_mac_keyset, v.created_at AS v_created_at").
		Join("JOIN vaults AS v ON v.id = ?TableAlias.vault_id").
		Where("?TableAlias.name = ?", name).
		Where("((v.scope_kind = ? AND v.owner_id = ?) OR (v.scope_kind = ? AND v.owner_id = ?))",
			store.VaultScopeIntern, in.ID, store.VaultScopeWorkspace, in.WorkspaceID).
		Scan(ctx)
	if err != nil {
		return "", ReasonInternal, apierr.Internal(err)
	}
	slices.SortFunc(found, func(a, b foundSecret) int {
		return strings.Compare(a.VScope, b.VScope) // "intern" < "workspace"
	})
	if len(found) == 0 {
		return "", ReasonSecretNotFound, apierr.New(http.StatusNotFound, apierr.ReasonNotFound,
			"no secret %q in the intern's vault or its workspace's vault", name)
	}
	f := found[0]
	row := &f.VaultSecret
	v := &store.Vault{ID: row.VaultID, OrganizationID: f.VOrg, ScopeKind: f.VScope, OwnerID: f.VOwner, DataKeyset: f.VData, MACKeyset: f.VMAC, CreatedAt: f.VCreated}
	if v.OrganizationID != in.OrganizationID {
		return "", ReasonInternal, apierr.Bug("vault %s belongs to another organization than its owner", v.ID)
	}
	rec.VaultID, rec.VaultScope = &v.ID, v.ScopeKind
	if row.Hosts == nil {
		return "", ReasonUnbound, apierr.New(http.StatusForbidden, apierr.ReasonSecretUnbound,
			"secret %q is bound to no host: store it again with hosts", name)
	}
	var hosts []string
	if err := json.Unmarshal([]byte(*row.Hosts), &hosts); err != nil {
		return "", ReasonDecryptFailed, apierr.Bug("vault %s secret %s: stored hosts do not parse: %w", v.ID, name, err)
	}
	if !slices.Contains(hosts, host) {
		return "", ReasonHostNotAllowed, apierr.New(http.StatusForbidden, apierr.ReasonHostNotAllowed,
			"secret %q is not bound to host %q: it is released only to %s", name, host, strings.Join(hosts, ", "))
	}
	kr, err := s.keyring(v)
	if err != nil {
		return "", ReasonDecryptFailed, apierr.Internal(err)
	}
	value, err := kr.Open(v.ID, name, hosts, row.Ciphertext)
	if err != nil {
		return "", ReasonDecryptFailed, apierr.Internal(fmt.Errorf("vault %s secret %s: %w", v.ID, name, err))
	}
	return value, ReasonHostMatch, nil
}

// actor names who asked, for the audit.
func actor(ctx context.Context) string {
	p := auth.From(ctx)
	switch {
	case p == nil:
		return "internal"
	case p.KeyID != "":
		return "key:" + p.KeyID
	default:
		return p.KeyKind
	}
}

// auditText makes caller-supplied text safe to store and read back: short,
// and quoted (escaped) unless it is plain printable ASCII.
func auditText(s string) string {
	const max = 300
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e || s[i] == '"' || s[i] == '\\' {
			return quote(s)
		}
	}
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// foundSecret is a secret row with its vault's columns, from the one query
// a release makes to find a name in the intern's and its workspace's vaults.
type foundSecret struct {
	store.VaultSecret `bun:",extend"`
	VScope            string    `bun:"v_scope_kind"`
	VOrg              string    `bun:"v_organization_id"`
	VOwner            string    `bun:"v_owner_id"`
	VData             []byte    `bun:"v_data_keyset"`
	VMAC              []byte    `bun:"v_mac_keyset"`
	VCreated          time.Time `bun:"v_created_at"`
}

// internRow is an intern with whether its organization is in the interns
// programme.
type internRow struct {
	store.Intern `bun:",extend"`
	Programme    bool `bun:"programme"`
}

// loadIntern reads a live (not deleted) intern and its programme flag; nil
// when there is none.
func (s *Service) loadIntern(ctx context.Context, id string) (*internRow, error) {
	var in internRow
	err := s.DB.NewSelect().Model(&in).ColumnExpr("?TableAlias.*").
		ColumnExpr("EXISTS (SELECT 1 FROM organizations o WHERE o.id = ?TableAlias.organization_id AND o.interns_programme) AS programme").
		Where("?TableAlias.id = ? AND ?TableAlias.state <> ?", id, store.InternDeleted).
		Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &in, nil
}

// liveIntern is the intern a release is for: live, and its organization in
// the programme (the release has no principal whose scope could say so).
func (s *Service) liveIntern(ctx context.Context, req ReleaseRequest) (*store.Intern, error) {
	if req.intern != nil {
		if !req.programme {
			return nil, nil
		}
		return req.intern, nil
	}
	in, err := s.loadIntern(ctx, req.InternID)
	if err != nil || in == nil || !in.Programme {
		return nil, err
	}
	return &in.Intern, nil
}
