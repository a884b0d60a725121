// Package bootstrap sets up a fresh database for the first five minutes of a
// user: a default organization with every entitlement, an admin user, a
// management key, a workspace, a workspace key and a demo intern.
package bootstrap

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/accounts"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/workspaces"
)

// Result is what bootstrap.json holds. The keys appear here and in the
// first start's output, and nowhere else.
type Result struct {
	OrganizationID string `json:"organization_id"`
	ManagementKey  string `json:"management_key"`
	WorkspaceID    string `json:"workspace_id"`
	WorkspaceKey   string `json:"workspace_key"`
	InternID       string `json:"intern_id"`
}

// FileName is the file the result is written to, inside the data directory.
const FileName = "bootstrap.json"

// Run bootstraps db if it holds no organization yet, and returns nil when
// there was nothing to do. Replicas starting together on one database race
// for the meta row; only the winner bootstraps.
func Run(ctx context.Context, db *bun.DB) (*Result, error) {
	n, err := db.NewSelect().Model((*store.Organization)(nil)).Count(ctx)
	if err != nil {
		return nil, err
	}
	if n > 0 {
		return nil, nil
	}
	claim := map[string]any{"key": "bootstrap", "value": time.Now().UTC().Format(time.RFC3339)}
	if _, err := db.NewInsert().Model(&claim).TableExpr("meta").Exec(ctx); err != nil {
		if store.IsUniqueViolation(err) {
			return nil, nil
		}
		return nil, err
	}
	acc := &accounts.Service{DB: db}
	op := auth.Operator("")
	org, err := acc.CreateOrganization(ctx, op, &cohortv1.CreateOrganizationRequest{Name: "Default",
		Entitlements: &cohortv1.Entitlements{InternsProgramme: true, WorkloadIdentity: true, VaultWrites: true}})
	if err != nil {
		return nil, fmt.Errorf("create organization: %w", err)
	}
	op = auth.Operator(org.GetId())
	user, err := acc.CreateUser(ctx, op, &cohortv1.CreateUserRequest{Email: "admin@cohort.local", Name: "Admin", Role: "admin"})
	if err != nil {
		return nil, fmt.Errorf("create admin user: %w", err)
	}
	op.UserID = user.GetId()
	mk, err := acc.CreateAPIKey(ctx, op, &cohortv1.CreateApiKeyRequest{Kind: store.KeyManagement, Name: "bootstrap management key"})
	if err != nil {
		return nil, fmt.Errorf("create management key: %w", err)
	}
	name, slug := "Default", "default"
	ws, err := (&workspaces.Service{DB: db}).Create(ctx, op, &cohortv1.CreateWorkspaceRequest{Name: &name, Slug: &slug})
	if err != nil {
		return nil, fmt.Errorf("create workspace: %w", err)
	}
	wk, err := acc.CreateAPIKey(ctx, op, &cohortv1.CreateApiKeyRequest{Kind: store.KeyWorkspace, Name: "bootstrap workspace key", WorkspaceId: ws.GetId()})
	if err != nil {
		return nil, fmt.Errorf("create workspace key: %w", err)
	}
	in, err := (&interns.Service{DB: db}).Create(ctx, op, &cohortv1.CreateInternRequest{WorkspaceId: ws.GetId(), Name: "demo", Model: interns.DemoModel})
	if err != nil {
		return nil, fmt.Errorf("create demo intern: %w", err)
	}
	return &Result{OrganizationID: org.GetId(), ManagementKey: mk.GetKey(), WorkspaceID: ws.GetId(),
		WorkspaceKey: wk.GetKey(), InternID: in.GetId()}, nil
}

// Write stores r as <dataDir>/bootstrap.json, readable by its owner only.
func Write(dataDir string, r *Result) (string, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(dataDir, FileName)
	b, _ := json.MarshalIndent(r, "", "  ")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return "", err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}
