// Package interns implements intern records: create, read, update (the
// model), suspend, resume and delete. Hosting them (daemons, agents) hangs
// off the Lifecycle hook; the records are what chat and the vault check.
package interns

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/uptrace/bun"
	"google.golang.org/protobuf/types/known/timestamppb"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/store"
)

// Bounds on intern fields (ADR 0001).
const (
	MaxName  = 100
	MaxModel = 256
	// DemoModel is the built-in offline model.
	DemoModel = "cohort/demo"
	// BuiltinAgent is the agent of an intern that names none.
	BuiltinAgent = "cohort"
)

// ErrOutsideProgramme is the 404 without a reason that callers outside the
// interns programme get on every intern and vault route.
var ErrOutsideProgramme = apierr.New(http.StatusNotFound, "", "not found")

// Lifecycle is told about state changes so a provisioner can start and stop
// daemons. It may be nil.
type Lifecycle interface {
	Changed(ctx context.Context, intern *store.Intern)
}

// Service implements the intern operations.
type Service struct {
	DB        *bun.DB
	Now       func() time.Time
	Lifecycle Lifecycle
	// Agents says which agent names an intern may run (the operator's
	// catalog, internal/agents); nil allows only the built-in agent.
	Agents AgentChecker
	// Ceiling is the operator's limits for every intern (serve's
	// --intern-*): an intern's own may only be lower. A 0 field bounds
	// that limit by the hard maxima alone (MaxLimitMemory, ...).
	Ceiling config.InternLimits
}

// AgentChecker validates an intern's agent name; the error says which
// names are allowed.
type AgentChecker interface {
	Check(agent string) error
}

func (s *Service) checkAgent(agent *string) error {
	if agent == nil || *agent == "" || *agent == BuiltinAgent {
		return nil
	}
	if s.Agents == nil {
		return apierr.BadRequest("agent must be %q: this gateway allows no other", BuiltinAgent)
	}
	if err := s.Agents.Check(*agent); err != nil {
		return apierr.BadRequest("%s", err.Error())
	}
	return nil
}

func (s *Service) now() time.Time {
	return store.Now(s.Now)
}

// CheckProgramme refuses principals outside the interns programme.
func CheckProgramme(p *auth.Principal) error {
	if p == nil {
		return apierr.Unauthenticated("missing API key")
	}
	if !p.InternsProgramme {
		return ErrOutsideProgramme
	}
	return nil
}

// workspaceFor picks the workspace a request acts on (WorkspaceFor).
func (s *Service) workspaceFor(ctx context.Context, p *auth.Principal, named string) (string, error) {
	return WorkspaceFor(ctx, s.DB, p, named)
}

// WorkspaceFor picks the workspace a request acts on: the key's own, or for
// a management key the one named, in its organization. There is no fallback
// to another scope.
func WorkspaceFor(ctx context.Context, db bun.IDB, p *auth.Principal, named string) (string, error) {
	if p.IsManagement() {
		if named == "" {
			return "", apierr.BadRequest("workspace_id is required with a management key")
		}
		ok, err := db.NewSelect().Model((*store.Workspace)(nil)).Where("id = ? AND organization_id = ?", named, p.OrganizationID).Exists(ctx)
		if err != nil {
			return "", apierr.Internal(err)
		}
		if !ok {
			return "", apierr.NotFound("workspace %q not found", named)
		}
		return named, nil
	}
	if p.WorkspaceID == "" {
		return "", apierr.Forbidden("this key has no active workspace")
	}
	if named != "" && named != p.WorkspaceID {
		return "", apierr.NotFound("workspace %q not found", named)
	}
	return p.WorkspaceID, nil
}

func checkFields(name, model *string) error {
	if name != nil {
		if strings.TrimSpace(*name) == "" || utf8.RuneCountInString(*name) > MaxName {
			return apierr.BadRequest("name must be 1 to %d characters", MaxName)
		}
	}
	if model != nil {
		if strings.TrimSpace(*model) == "" || utf8.RuneCountInString(*model) > MaxModel {
			return apierr.BadRequest("model must be 1 to %d characters", MaxModel)
		}
	}
	return nil
}

// ErrDeparted is the 403 (without a reason) for a key whose creator left
// the organization and holds no grant: every intern route refuses it.
var ErrDeparted = apierr.Forbidden("the creator of this key has left the organization")

// checkCaller is the gate of the intern operations: the programme (plain
// 404), then the departed creator (plain 403), as the chat's.
func checkCaller(p *auth.Principal) error {
	if err := CheckProgramme(p); err != nil {
		return err
	}
	if p.Departed() {
		return ErrDeparted
	}
	return nil
}

// Create makes an intern record in provisioning state.
func (s *Service) Create(ctx context.Context, p *auth.Principal, req *cohortv1.CreateInternRequest) (*cohortv1.Intern, error) {
	if err := checkCaller(p); err != nil {
		return nil, err
	}
	ws, err := s.workspaceFor(ctx, p, req.GetWorkspaceId())
	if err != nil {
		return nil, err
	}
	name, model := req.GetName(), req.GetModel()
	if model == "" {
		model = DemoModel
	}
	if err := checkFields(&name, &model); err != nil {
		return nil, err
	}
	agent := req.GetAgent()
	if err := s.checkAgent(&agent); err != nil {
		return nil, err
	}
	if agent == BuiltinAgent {
		agent = "" // one spelling of the built-in agent in the rows
	}
	var limits config.InternLimits
	if err := setLimits(p, s.Ceiling, &limits, req.GetLimits()); err != nil {
		return nil, err
	}
	in := &store.Intern{ID: uuid.NewString(), OrganizationID: p.OrganizationID, WorkspaceID: ws, Name: name,
		Model: model, Agent: agent, State: store.InternProvisioning, CreatedBy: p.UserID, CreatedAt: s.now(), Limits: limits}
	if _, err := s.DB.NewInsert().Model(in).Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	s.changed(ctx, in)
	return Proto(in), nil
}

func (s *Service) changed(ctx context.Context, in *store.Intern) {
	if s.Lifecycle != nil {
		s.Lifecycle.Changed(ctx, in)
	}
}

// Load returns the live intern id in the caller's scope. A missing intern,
// a deleted one and one of another workspace are the same 404 not_found.
func (s *Service) Load(ctx context.Context, p *auth.Principal, id string) (*store.Intern, error) {
	if err := checkCaller(p); err != nil {
		return nil, err
	}
	if strings.ContainsRune(id, 0) || !utf8.ValidString(id) {
		// No intern has such an id (and PostgreSQL refuses it as text).
		return nil, apierr.NotFound("intern not found")
	}
	var in store.Intern
	err := s.DB.NewSelect().Model(&in).Where("?TableAlias.id = ?", id).
		Where(visibleRule("?TableAlias", "?", "?", "?"), p.OrganizationID, p.IsManagement(), p.WorkspaceID).
		Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, apierr.NotFound("intern %q not found", id)
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	return &in, nil
}

// visibleRule is the one text of which interns a key may see: its
// organization's, not deleted, and only its own workspace's unless it is a
// management key. It is SQL over the interns table as alias i, given the
// key's organization, whether it is a management key (a boolean) and its
// workspace as the SQL expressions org, management and workspace. Load
// applies it through bun with the principal's values; visible applies it
// to the key's row in the key lookup itself.
func visibleRule(i, org, management, workspace string) string {
	return i + ".organization_id = " + org +
		" AND " + i + ".state <> '" + store.InternDeleted + "'" +
		" AND (" + management + " OR " + i + ".workspace_id = " + workspace + ")"
}

// visible reads, with the key, the live intern of the given id the key may
// see (visibleRule on the key's columns). The first column says whether a
// row matched; the timestamps are not read.
//
// It is hand-written SQL beside bun because it rides on the key lookup's
// prepared statement (auth.Join): a chat turn then makes one database round
// trip, and SQLite does not parse bun's literal SQL again on every turn.
// Its figure (docs/benchmarks.md as of 233a0f0, "Chat, round 3", BenchmarkTurn, old and
// new binaries alternated, medians of 6): a turn through the REST door took
// 317.1 µs against 415.7 µs on SQLite and 599.7 against 740.5 µs on
// PostgreSQL, the gateway's added time on SQLite 190 µs against 285 µs.
var visible = &auth.Join{Name: "interns.visible", SQL: func(ph string) (string, string) {
	return `,
	i.id IS NOT NULL, COALESCE(i.id, ''), COALESCE(i.organization_id, ''), COALESCE(i.workspace_id, ''),
	COALESCE(i.name, ''), COALESCE(i.model, ''), COALESCE(i.agent, ''), COALESCE(i.state, ''), COALESCE(i.created_by, ''),
	COALESCE(i.daemon_url, ''), COALESCE(i.daemon_secret, ''), COALESCE(i.provisioner, '')`,
		`LEFT JOIN interns i ON i.id = ` + ph + ` AND ` +
			visibleRule("i", "k.organization_id", "k.kind = '"+store.KeyManagement+"'", "k.workspace_id")
}}

// Preloaded is the intern row Authenticate read with the key, or its
// absence.
type Preloaded struct {
	id string
	in *store.Intern
}

// Get answers as Load would have for the preloaded row.
func (pl Preloaded) Get(p *auth.Principal) (*store.Intern, error) {
	if err := CheckProgramme(p); err != nil {
		return nil, err
	}
	if pl.in == nil {
		return nil, apierr.NotFound("intern %q not found", pl.id)
	}
	return pl.in, nil
}

// Authenticate resolves an Authorization header and reads intern id in the
// same database round trip (the chat door's hot path). The key's state is
// read as on every request; the intern's row is the one Load would return,
// without CreatedAt and UpdatedAt. The caller checks the programme and the
// departed creator before it uses the row, as Load's callers do.
func (s *Service) Authenticate(ctx context.Context, a *auth.Authenticator, header, id string) (*auth.Principal, Preloaded, error) {
	var in store.Intern
	var found bool
	joinID := id
	if strings.ContainsRune(id, 0) || !utf8.ValidString(id) {
		// No intern has such an id, and PostgreSQL refuses it as text:
		// look up none (a 404 on both databases).
		joinID = ""
	}
	p, err := a.BearerJoin(ctx, header, visible, joinID, &found, &in.ID, &in.OrganizationID, &in.WorkspaceID,
		&in.Name, &in.Model, &in.Agent, &in.State, &in.CreatedBy, &in.DaemonURL, &in.DaemonSecret, &in.Provisioner)
	if err != nil {
		return nil, Preloaded{}, err
	}
	pl := Preloaded{id: id}
	if found {
		pl.in = &in
	}
	return p, pl, nil
}

// Get returns one intern.
func (s *Service) Get(ctx context.Context, p *auth.Principal, id string) (*cohortv1.Intern, error) {
	in, err := s.Load(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return Proto(in), nil
}

// List returns the live interns of a workspace.
func (s *Service) List(ctx context.Context, p *auth.Principal, workspaceID string) ([]*cohortv1.Intern, error) {
	if err := checkCaller(p); err != nil {
		return nil, err
	}
	ws, err := s.workspaceFor(ctx, p, workspaceID)
	if err != nil {
		return nil, err
	}
	var rows []store.Intern
	err = s.DB.NewSelect().Model(&rows).Where("workspace_id = ? AND state <> ?", ws, store.InternDeleted).Order("created_at", "id").Scan(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	out := make([]*cohortv1.Intern, len(rows))
	for i := range rows {
		out[i] = Proto(&rows[i])
	}
	return out, nil
}

// Update changes an intern's name, model, agent or limits.
func (s *Service) Update(ctx context.Context, p *auth.Principal, req *cohortv1.UpdateInternRequest) (*cohortv1.Intern, error) {
	in, err := s.Load(ctx, p, req.GetId())
	if err != nil {
		return nil, err
	}
	if err := checkFields(req.Name, req.Model); err != nil {
		return nil, err
	}
	if err := s.checkAgent(req.Agent); err != nil {
		return nil, err
	}
	// A change of limits restarts the intern's jail, as a new model does.
	if err := setLimits(p, s.Ceiling, &in.Limits, req.GetLimits()); err != nil {
		return nil, err
	}
	if req.Name != nil {
		in.Name = req.GetName()
	}
	if req.Model != nil {
		in.Model = req.GetModel()
	}
	if req.Agent != nil {
		// A new agent restarts the intern's jail (the provisioner compares
		// the row's agent with the running one's).
		in.Agent = req.GetAgent()
		if in.Agent == BuiltinAgent {
			in.Agent = ""
		}
	}
	now := s.now()
	in.UpdatedAt = &now
	if _, err := s.DB.NewUpdate().Model(in).Column("name", "model", "agent", "updated_at",
		"limit_memory", "limit_processes", "limit_cpu_weight", "limit_cpus", "limit_tmpfs", "limit_disk").WherePK().Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	s.changed(ctx, in)
	return Proto(in), nil
}

// transition moves an intern from one of the from states to to.
func (s *Service) transition(ctx context.Context, p *auth.Principal, id, to string, from ...string) (*cohortv1.Intern, error) {
	in, err := s.Load(ctx, p, id)
	if err != nil {
		return nil, err
	}
	ok := false
	for _, f := range from {
		ok = ok || in.State == f
	}
	if !ok {
		return nil, apierr.Conflict(apierr.ReasonConflict, "intern is %s", in.State)
	}
	return s.SetState(ctx, in, to)
}

// SetState records a new state (the provisioner uses it too).
func (s *Service) SetState(ctx context.Context, in *store.Intern, to string) (*cohortv1.Intern, error) {
	now := s.now()
	in.State, in.UpdatedAt = to, &now
	if _, err := s.DB.NewUpdate().Model(in).Column("state", "updated_at").WherePK().Exec(ctx); err != nil {
		return nil, apierr.Internal(err)
	}
	s.changed(ctx, in)
	return Proto(in), nil
}

// Suspend stops a provisioning, running or sleeping intern.
func (s *Service) Suspend(ctx context.Context, p *auth.Principal, id string) (*cohortv1.Intern, error) {
	return s.transition(ctx, p, id, store.InternSuspended, store.InternProvisioning, store.InternRunning, store.InternSleeping)
}

// Resume provisions a suspended intern again.
func (s *Service) Resume(ctx context.Context, p *auth.Principal, id string) (*cohortv1.Intern, error) {
	return s.transition(ctx, p, id, store.InternProvisioning, store.InternSuspended)
}

// Delete removes an intern; afterwards it is not found.
func (s *Service) Delete(ctx context.Context, p *auth.Principal, id string) (*cohortv1.Intern, error) {
	return s.transition(ctx, p, id, store.InternDeleted, store.InternProvisioning, store.InternRunning, store.InternSleeping, store.InternSuspended)
}

// Proto converts a row.
func Proto(in *store.Intern) *cohortv1.Intern {
	out := &cohortv1.Intern{Id: in.ID, WorkspaceId: in.WorkspaceID, Name: in.Name, Model: in.Model, State: in.State,
		Agent: cmp.Or(in.Agent, BuiltinAgent), CreatedAt: timestamppb.New(in.CreatedAt), Limits: limitsProto(in.Limits)}
	if in.UpdatedAt != nil {
		out.UpdatedAt = timestamppb.New(*in.UpdatedAt)
	}
	return out
}
