// Package remote is the fleet backend of daemons the operator runs: each
// on a host of its own (`cohort intern`, jailed there or not), registered
// with its URL and secret (`cohort admin intern register`). It starts,
// stops and observes nothing; it only tells the reconciler whether the
// registered daemon answers.
package remote

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/store"
)

// Name is this backend's, as rows record it.
const Name = "remote"

// Backend is the remote daemons' backend; it has no configuration.
type Backend struct {
	check func(ctx context.Context, url, secret string) error
}

var _ provision.Backend = (*Backend)(nil)

func (*Backend) Name() string { return Name }

// Open keeps the reconciler's health check, the only thing it does.
func (b *Backend) Open(ctx context.Context, h provision.Host) error {
	b.check = h.Check
	return nil
}

// Observe sees nothing: the daemons are the operator's.
func (*Backend) Observe() ([]provision.Observed, bool) { return nil, false }

func (*Backend) Fingerprint(provision.Spec) string { return "" }

func (*Backend) Claim(context.Context, string) (func(), error) { return func() {}, nil }

// Ensure returns the registered daemon if it answers with the registered
// secret; ErrUnhosted otherwise (the intern waits for the operator).
func (b *Backend) Ensure(ctx context.Context, spec provision.Spec) (provision.Daemon, error) {
	if spec.URL == "" || spec.Secret == "" {
		return provision.Daemon{}, provision.ErrUnhosted
	}
	if b.check != nil {
		if err := b.check(ctx, spec.URL, spec.Secret); err != nil {
			return provision.Daemon{}, fmt.Errorf("%w: the registered daemon does not answer: %s", provision.ErrUnhosted, connect.CodeOf(err))
		}
	}
	return provision.Daemon{URL: spec.URL, Secret: spec.Secret, Log: []any{"remote", true}}, nil
}

func (*Backend) Sleep(context.Context, string) error  { return nil }
func (*Backend) Remove(context.Context, string) error { return nil }
func (*Backend) Close()                               {}

// Register records a remote daemon's URL and secret for an intern, after
// checking that the daemon answers with that secret, and marks a
// provisioning intern running. The secret is stored wrapped by the KEK.
func Register(ctx context.Context, p *provision.Provisioner, internID, daemonURL, secret string) (*store.Intern, error) {
	u, err := url.Parse(daemonURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, apierr.BadRequest("the daemon URL must be http:// or https:// with a host")
	}
	secret = strings.TrimSpace(secret)
	if secret == "" {
		return nil, apierr.BadRequest("the daemon secret is empty")
	}
	var in store.Intern
	if err := p.DB.NewSelect().Model(&in).Where("id = ? AND state <> ?", internID, store.InternDeleted).Scan(ctx); err != nil {
		return nil, apierr.NotFound("intern %q not found", internID)
	}
	hctx, cancel := context.WithTimeout(ctx, healthTimeout(p))
	defer cancel()
	if err := p.Healthy(hctx, daemonURL, secret); err != nil {
		return nil, apierr.New(http.StatusBadGateway, apierr.ReasonInternUnreachable, "the daemon did not answer Status with this secret: %s", connect.CodeOf(err))
	}
	if err := p.Record(ctx, internID, strings.TrimRight(daemonURL, "/"), secret, Name); err != nil {
		return nil, apierr.Internal(err)
	}
	if err := p.DB.NewSelect().Model(&in).WherePK().Scan(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	return &in, nil
}

func healthTimeout(p *provision.Provisioner) time.Duration {
	if p.HealthTimeout > 0 {
		return p.HealthTimeout
	}
	return 30 * time.Second
}
