package main

import (
	"context"
	"errors"

	"github.com/cohort-dev/cohort/internal/interncmd"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/remote"
)

// `cohort intern` and `cohort agent` are internal/interncmd's, shared with
// cmd/cohort-intern; `intern --jail` runs runJailedDaemon (jail.go).

// internRegister records where the operator runs an intern's daemon and
// the secret it accepts; the secret is stored wrapped by the KEK.
func internRegister(ctx context.Context, e *adminEnv) error {
	if e.f.id == "" || e.f.url == "" || e.f.secretFile == "" {
		return errors.New("--id, --url and --secret-file are required")
	}
	secret, err := interncmd.ReadSecret(e.f.secretFile)
	if err != nil {
		return err
	}
	kek, err := adminKEK(e)
	if err != nil {
		return err
	}
	p := &provision.Provisioner{DB: e.db, KEK: kek, Backend: &remote.Backend{}}
	in, err := remote.Register(ctx, p, e.f.id, e.f.url, secret)
	if err != nil {
		return err
	}
	return e.printOne(interns.Proto(in))
}
