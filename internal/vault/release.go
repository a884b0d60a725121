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
	value, reason, err := s.release(ctx, rec, req.InternID, req.Name, req.Host)
	rec.Reason = reason
	rec.Outcome = OutcomeReleased
	if err != nil {
		rec.Outcome = OutcomeRefused
		value = ""
	}
	// The audit is written even when the caller has gone: a decision
	// taken is a decision recorded.
	if _, aerr := s.DB.NewInsert().Model(rec).Exec(context.WithoutCancel(ctx)); aerr != nil {
		return "", apierr.Internal(fmt.Errorf("audit vault release: %w", aerr))
	}
	return value, err
}

func (s *Service) release(ctx context.Context, rec *store.VaultRelease, internID, name, destinationHost string) (string, string, error) {
	host, err := NormalizeHost(destinationHost)
	if err != nil {
		return "", ReasonInvalidHost, apierr.BadRequest("destination host: %v", err)
	}
	rec.Host = host
	if err := CheckName(name); err != nil {
		return "", ReasonInvalidName, err
	}
	var in store.Intern
	// The intern must be live and its organization in the programme; the
	// release has no principal whose scope could say so.
	err = s.DB.NewSelect().Model(&in).
		Where("?TableAlias.id = ? AND ?TableAlias.state <> ?", internID, store.InternDeleted).
		Where("EXISTS (SELECT 1 FROM organizations o WHERE o.id = ?TableAlias.organization_id AND o.interns_programme)").
		Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ReasonInternNotFound, apierr.NotFound("intern not found")
	}
	if err != nil {
		return "", ReasonInternal, apierr.Internal(err)
	}
	rec.OrganizationID = &in.OrganizationID
	// The intern's own vault first, then its workspace's.
	var v *store.Vault
	var row *store.VaultSecret
	for _, o := range []struct{ scope, owner string }{{store.VaultScopeIntern, in.ID}, {store.VaultScopeWorkspace, in.WorkspaceID}} {
		vv, err := s.findVault(ctx, o.scope, o.owner)
		if err == errSecretNotFound {
			continue
		}
		if err != nil {
			return "", ReasonInternal, err
		}
		if vv.OrganizationID != in.OrganizationID {
			return "", ReasonInternal, apierr.Internal(fmt.Errorf("vault %s belongs to another organization than its owner", vv.ID))
		}
		rr, err := s.findSecret(ctx, vv, name)
		if err == errSecretNotFound {
			continue
		}
		if err != nil {
			return "", ReasonInternal, err
		}
		v, row = vv, rr
		break
	}
	if row == nil {
		return "", ReasonSecretNotFound, apierr.New(http.StatusNotFound, "not_found",
			"no secret %q in the intern's vault or its workspace's vault", name)
	}
	rec.VaultID, rec.VaultScope = &v.ID, v.ScopeKind
	if row.Hosts == nil {
		return "", ReasonUnbound, apierr.New(http.StatusForbidden, "secret_unbound",
			"secret %q is bound to no host: store it again with hosts", name)
	}
	var hosts []string
	if err := json.Unmarshal([]byte(*row.Hosts), &hosts); err != nil {
		return "", ReasonDecryptFailed, apierr.Internal(fmt.Errorf("vault %s secret %s: hosts do not parse: %w", v.ID, name, err))
	}
	if !slices.Contains(hosts, host) {
		return "", ReasonHostNotAllowed, apierr.New(http.StatusForbidden, "host_not_allowed",
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

func notFoundReason(err error) string {
	if err == errSecretNotFound {
		return ReasonSecretNotFound
	}
	return ReasonInternal
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
