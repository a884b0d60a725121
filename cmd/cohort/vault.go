package main

import (
	"context"
	"fmt"
	"os"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/vault"
)

// vaultRotateKEK is `cohort admin vault rotate-kek`: add a fresh primary key
// to the KEK file, then re-wrap every vault's data keys under it. The old
// key stays in the file, so servers running meanwhile keep opening both
// wrappings; they load the new key the first time they meet it. No
// ciphertext is touched.
func vaultRotateKEK(ctx context.Context, e *adminEnv) error {
	path := e.cfg.Store.KEKPath()
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("no key-encryption key to rotate: %w", err)
	}
	id, err := envelope.Rotate(path)
	if err != nil {
		return err
	}
	kek, err := envelope.Load(path)
	if err != nil {
		return err
	}
	n, err := (&vault.Service{DB: e.db, KEK: kek}).RewrapAll(ctx)
	if err != nil {
		// The rotation stands; what was re-wrapped is re-wrapped and the
		// rest still opens with the old key. Running the command again
		// finishes the job.
		return fmt.Errorf("new primary key %d; re-wrapped %d vaults, then: %w", id, n, err)
	}
	return e.printOne(&cohortv1.KekRotation{PrimaryKeyId: id, VaultsRewrapped: n})
}

// vaultAudit is `cohort admin vault audit`: the organization's release
// decisions (who, which secret, which host, which run, outcome), newest
// first; the same listing as VaultAdminService.ListSecretReleases.
func vaultAudit(ctx context.Context, e *adminEnv) error {
	p, err := e.operator()
	if err != nil {
		return err
	}
	res, err := (&vault.Service{DB: e.db}).ListReleases(ctx, p, &cohortv1.ListSecretReleasesRequest{InternId: e.f.id, Limit: vault.MaxListLimit})
	if err != nil {
		return err
	}
	return e.print(protos(res.GetReleases())...)
}
