package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"sort"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/accounts"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/interns"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/workspaces"
	"github.com/uptrace/bun"
)

// adminEnv is what every admin command gets: the services over the database,
// the parsed flags and where to print.
type adminEnv struct {
	db   *bun.DB
	acc  *accounts.Service
	ws   *workspaces.Service
	in   *interns.Service
	out  io.Writer
	json bool
	init bool // --init: create what is missing (database, data directory, KEK)
	f    *adminFlags
	fed  *fedFlagSet
	hook *hookFlagSet
	cfg  config.Config
}

type adminFlags struct {
	org, user, workspace, id, name, slug, email, role, kind, model, agent, description string
	url, secretFile                                                                    string
	internsProgramme, workloadIdentity, vaultWrites                                    bool

	// An intern's own limits as written on the command line ("" not given).
	memory, maxProcesses, cpuWeight, cpus, tmpfs, disk string
}

// adminFlagHooks register the flags of command groups kept in their own
// files (admin_federation.go, admin_webhooks.go).
var adminFlagHooks = []func(*flag.FlagSet, *adminEnv){fedFlags, hookFlags}

type adminCmd struct {
	help string
	run  func(ctx context.Context, e *adminEnv) error
}

func (e *adminEnv) operator() (*auth.Principal, error) {
	if e.f.org == "" {
		return nil, errors.New("--org is required")
	}
	p := auth.Operator(e.f.org)
	p.UserID = e.f.user
	return p, nil
}

// print writes messages as protojson (--json) or one compact line each.
func (e *adminEnv) print(msgs ...proto.Message) error {
	if e.json {
		parts := make([]string, len(msgs))
		for i, m := range msgs {
			b, err := stableJSON(m)
			if err != nil {
				return err
			}
			parts[i] = string(b)
		}
		_, err := fmt.Fprintf(e.out, "[%s]\n", strings.Join(parts, ","))
		return err
	}
	for _, m := range msgs {
		fmt.Fprintln(e.out, protojson.MarshalOptions{UseProtoNames: true}.Format(m))
	}
	return nil
}

// printOne writes a single message (not wrapped in an array with --json).
func (e *adminEnv) printOne(m proto.Message) error {
	if e.json {
		b, err := stableJSON(m)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(e.out, string(b))
		return err
	}
	_, err := fmt.Fprintln(e.out, protojson.MarshalOptions{UseProtoNames: true, Multiline: true}.Format(m))
	return err
}

// stableJSON is protojson with proto field names, compacted: protojson
// varies its whitespace on purpose, and scripts read this output.
func stableJSON(m proto.Message) ([]byte, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

var coreAdminCmds = map[string]adminCmd{
	"org create": {"--name N [--interns-programme] [--workload-identity] [--vault-writes]", func(ctx context.Context, e *adminEnv) error {
		o, err := e.acc.CreateOrganization(ctx, auth.Operator(""), &cohortv1.CreateOrganizationRequest{Name: e.f.name,
			Entitlements: &cohortv1.Entitlements{InternsProgramme: e.f.internsProgramme, WorkloadIdentity: e.f.workloadIdentity, VaultWrites: e.f.vaultWrites}})
		if err != nil {
			return err
		}
		return e.printOne(o)
	}},
	"org list": {"", func(ctx context.Context, e *adminEnv) error {
		os, err := e.acc.ListOrganizations(ctx, auth.Operator(""))
		if err != nil {
			return err
		}
		return e.print(protos(os)...)
	}},
	"org entitlements": {"--org ID [--interns-programme] [--workload-identity] [--vault-writes] (sets all three)", func(ctx context.Context, e *adminEnv) error {
		o, err := e.acc.SetEntitlements(ctx, auth.Operator(""), e.f.org,
			&cohortv1.Entitlements{InternsProgramme: e.f.internsProgramme, WorkloadIdentity: e.f.workloadIdentity, VaultWrites: e.f.vaultWrites})
		if err != nil {
			return err
		}
		return e.printOne(o)
	}},
	"user create": {"--org ID --email E [--name N] [--role admin|member]", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		u, err := e.acc.CreateUser(ctx, p, &cohortv1.CreateUserRequest{Email: e.f.email, Name: e.f.name, Role: e.f.role})
		if err != nil {
			return err
		}
		return e.printOne(u)
	}},
	"user list": {"--org ID", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		us, err := e.acc.ListUsers(ctx, p)
		if err != nil {
			return err
		}
		return e.print(protos(us)...)
	}},
	"user left": {"--org ID --user ID   (mark a user as having left)", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		u, err := e.acc.MarkUserLeft(ctx, p, &cohortv1.MarkUserLeftRequest{UserId: e.f.user})
		if err != nil {
			return err
		}
		return e.printOne(u)
	}},
	"grant create": {"--org ID --user ID [--workspace ID]", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		g, err := e.acc.CreateGrant(ctx, p, &cohortv1.CreateGrantRequest{UserId: e.f.user, WorkspaceId: e.f.workspace})
		if err != nil {
			return err
		}
		return e.printOne(g)
	}},
	"key create": {"--org ID --user ID --kind management|workspace|personal [--workspace ID] [--name N]", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		res, err := e.acc.CreateAPIKey(ctx, p, &cohortv1.CreateApiKeyRequest{Kind: e.f.kind, Name: e.f.name, WorkspaceId: e.f.workspace, UserId: e.f.user})
		if err != nil {
			return err
		}
		return e.printOne(res)
	}},
	"key list": {"--org ID [--workspace ID]", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		ks, err := e.acc.ListAPIKeys(ctx, p, &cohortv1.ListApiKeysRequest{WorkspaceId: e.f.workspace})
		if err != nil {
			return err
		}
		return e.print(protos(ks)...)
	}},
	"key disable": {"--org ID --id KEY_ID", keyState((*accounts.Service).DisableAPIKey)},
	"key enable":  {"--org ID --id KEY_ID", keyState((*accounts.Service).EnableAPIKey)},
	"key delete":  {"--org ID --id KEY_ID", keyState((*accounts.Service).DeleteAPIKey)},
	"workspace create": {"--org ID --user ID --name N [--slug S] [--description D]", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		if p.UserID == "" {
			return errors.New("--user is required (the workspace's created_by)")
		}
		w, err := e.ws.Create(ctx, p, &cohortv1.CreateWorkspaceRequest{Name: optional(e.f.name), Slug: optional(e.f.slug), Description: optional(e.f.description)})
		if err != nil {
			return err
		}
		return e.printOne(w)
	}},
	"workspace list": {"--org ID", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		ws, err := e.ws.List(ctx, p)
		if err != nil {
			return err
		}
		return e.print(protos(ws)...)
	}},
	"intern create": {"--org ID --workspace ID --name N [--model M] [--agent A] [--user ID] [limits]", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		limits, err := e.f.limits()
		if err != nil {
			return err
		}
		in, err := e.in.Create(ctx, p, &cohortv1.CreateInternRequest{WorkspaceId: e.f.workspace, Name: e.f.name, Model: e.f.model, Agent: e.f.agent, Limits: limits})
		if err != nil {
			return err
		}
		return e.printOne(in)
	}},
	"intern list": {"--org ID --workspace ID", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		ins, err := e.in.List(ctx, p, e.f.workspace)
		if err != nil {
			return err
		}
		return e.print(protos(ins)...)
	}},
	"intern register": {"--id INTERN_ID --url URL --secret-file FILE   (a remote daemon: cohort serve --provisioner remote)", internRegister},
	"intern get":      {"--org ID --id INTERN_ID", internOp((*interns.Service).Get)},
	"intern suspend":  {"--org ID --id INTERN_ID", internOp((*interns.Service).Suspend)},
	"intern resume":   {"--org ID --id INTERN_ID", internOp((*interns.Service).Resume)},
	"intern delete":   {"--org ID --id INTERN_ID", internOp((*interns.Service).Delete)},
	"intern update": {"--org ID --id INTERN_ID [--name N] [--model M] [--agent A] [limits, 0: the operator's]", func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		limits, err := e.f.limits()
		if err != nil {
			return err
		}
		in, err := e.in.Update(ctx, p, &cohortv1.UpdateInternRequest{Id: e.f.id, Name: optional(e.f.name), Model: optional(e.f.model), Agent: optional(e.f.agent), Limits: limits})
		if err != nil {
			return err
		}
		return e.printOne(in)
	}},
	"vault audit":      {"--org ID [--id INTERN_ID]  the vault's release decisions, newest first (at most 1000; never values)", vaultAudit},
	"vault rotate-kek": {"[--kek-file F]  new KEK primary key; re-wrap every vault's data keys (ciphertexts untouched, no downtime)", vaultRotateKEK},
}

func keyState(op func(*accounts.Service, context.Context, *auth.Principal, string) (*cohortv1.ApiKey, error)) func(context.Context, *adminEnv) error {
	return func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		k, err := op(e.acc, ctx, p, e.f.id)
		if err != nil {
			return err
		}
		return e.printOne(k)
	}
}

func internOp(op func(*interns.Service, context.Context, *auth.Principal, string) (*cohortv1.Intern, error)) func(context.Context, *adminEnv) error {
	return func(ctx context.Context, e *adminEnv) error {
		p, err := e.operator()
		if err != nil {
			return err
		}
		in, err := op(e.in, ctx, p, e.f.id)
		if err != nil {
			return err
		}
		return e.printOne(in)
	}
}

func protos[T proto.Message](in []T) []proto.Message {
	out := make([]proto.Message, len(in))
	for i, m := range in {
		out[i] = m
	}
	return out
}

// adminCmds are every admin command by name: the core ones and the
// groups kept in their own files.
func adminCmds() map[string]adminCmd {
	all := maps.Clone(coreAdminCmds)
	maps.Copy(all, fedCmds())
	maps.Copy(all, hookCmds())
	return all
}

func adminUsage(w io.Writer) {
	adminCmds := adminCmds()
	fmt.Fprintln(w, "Usage: cohort admin [flags] <noun> <verb> [flags]\n\nCommands:")
	names := make([]string, 0, len(adminCmds))
	for n := range adminCmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-18s %s\n", n, adminCmds[n].help)
	}
	fmt.Fprintln(w, `
Common flags (before or after the command): --data-dir, --database-url, --kek-file (as for serve), --json.
The database must exist (cohort serve or cohort migrate made it); --init creates it,
and the data directory and key-encryption key, when missing.`)
}

// parseInterspersed parses flags wherever they stand among args and returns
// the other words in order: the standard flag package stops at the first
// word, so `admin --data-dir X org list` and `admin org list --data-dir X`
// both need a parse per word.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var words []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return words, nil
		}
		words = append(words, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func admin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	f := &adminFlags{}
	e := &adminEnv{out: stdout, f: f}
	fs := flag.NewFlagSet("admin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// A mistyped flag gets its error and a pointer, not every command.
	fs.Usage = func() { fmt.Fprintln(stderr, `Run "cohort admin help" for the commands and flags.`) }
	dbFlags(fs, &cfg)
	fs.BoolVar(&e.json, "json", false, "print JSON")
	fs.BoolVar(&e.init, "init", false, "create the database, the data directory and the key-encryption key when missing (without it admin refuses to)")
	for flagName, p := range map[string]*string{"org": &f.org, "user": &f.user, "workspace": &f.workspace, "id": &f.id, "name": &f.name,
		"slug": &f.slug, "email": &f.email, "role": &f.role, "kind": &f.kind, "model": &f.model, "agent": &f.agent, "description": &f.description,
		"url": &f.url, "secret-file": &f.secretFile} {
		fs.StringVar(p, flagName, "", flagName)
	}
	internLimitFlags(fs, f)
	fs.BoolVar(&f.internsProgramme, "interns-programme", false, "entitlement: the interns programme")
	fs.BoolVar(&f.workloadIdentity, "workload-identity", false, "entitlement: workload identity federation")
	fs.BoolVar(&f.vaultWrites, "vault-writes", false, "entitlement: vault writes")
	for _, register := range adminFlagHooks {
		register(fs, e)
	}
	words, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		adminUsage(stdout)
		fmt.Fprintln(stdout, "\nFlags:")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil
	}
	if err != nil {
		return err
	}
	if len(words) > 0 && words[0] == "help" {
		adminUsage(stdout)
		return nil
	}
	if len(words) < 2 {
		adminUsage(stdout)
		return errors.New("missing admin command")
	}
	name := words[0] + " " + words[1]
	cmd, ok := adminCmds()[name]
	if !ok {
		return fmt.Errorf("unknown admin command %q (cohort admin help lists them)", name)
	}
	if len(words) > 2 {
		return fmt.Errorf("unexpected argument %q", words[2])
	}
	db, err := openAdminDB(ctx, cfg, e.init)
	if err != nil {
		return err
	}
	defer db.Close()
	e.db = db
	e.cfg = cfg
	e.acc = &accounts.Service{DB: db}
	e.ws = &workspaces.Service{DB: db}
	// The agents an intern may name: serve's catalog, from the same
	// variables (COHORT_AGENT_MODULES, COHORT_AGENTS, COHORT_AGENT_ENDPOINTS).
	agentCfg := config.Default()
	agentFlags(flag.NewFlagSet("agents", flag.ContinueOnError), &agentCfg)
	catalog, err := agentCfg.Catalog()
	if err != nil {
		return err
	}
	// The operator's limits, the ceiling of an intern's own: serve's,
	// from the same variables (COHORT_INTERN_MEMORY, ...).
	limitCfg := config.DefaultInternLimits()
	if err := limitFlags(flag.NewFlagSet("limits", flag.ContinueOnError), &limitCfg, "")(); err != nil {
		return err
	}
	e.in = &interns.Service{DB: db, Agents: catalog, Ceiling: store.InternLimits(limitCfg)}
	return cmd.run(ctx, e)
}
