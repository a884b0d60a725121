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
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/accounts"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/interns"
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
	// cfg is the database's settings and the operator's policies the
	// command applies, read by serve's own flag declarations (ADR 0962).
	cfg    config.Config
	checks []func() error
}

// adminFlags are the values of the admin commands' own flags.
type adminFlags struct {
	org, user, workspace, id, name, slug, email, role, kind, model, agent, description string
	url, secretFile                                                                    string
	internsProgramme, workloadIdentity, vaultWrites                                    bool

	// An intern's own limits as written on the command line ("" not given).
	memory, maxProcesses, cpuWeight, cpus, tmpfs, disk string

	// Federation: optStrings tell "set to empty" from "not given".
	issuerURL, jwksURL, subject, audience, condition, apiKey, enabled optString
	issuer, value, token, tokenFile, scopes, tokenType                string
	limit                                                             int

	// Webhooks.
	events, status string
	pageSize       int
}

// An adminCmd is one `cohort admin NOUN VERB`: its synopsis, the flags it
// takes (names of adminFlagDefs; the common ones, adminCommonFlags, come
// with every command) and what it does.
type adminCmd struct {
	help  string
	flags []string
	run   func(ctx context.Context, e *adminEnv) error
}

// adminCommonFlags are every admin command's: where the database is, and
// how to print.
func adminCommonFlags(fs *flag.FlagSet, e *adminEnv) {
	dbFlags(fs, &e.cfg.Store)
	fs.BoolVar(&e.json, "json", false, "print JSON")
	fs.BoolVar(&e.init, "init", false, "create the database, the data directory and the key-encryption key when missing (without it admin refuses to)")
}

// adminFlagDefs declare each flag an admin command may take, by the name
// the command lists. The serve-* entries are serve's own declarations of
// the operator's policies (settings.go), so that admin applies what serve
// does, given the same way: the same flags, the same COHORT_* variables.
var adminFlagDefs = map[string]func(fs *flag.FlagSet, e *adminEnv){
	"org":               strFlag(func(f *adminFlags) *string { return &f.org }, "org", "the organization's id"),
	"user":              strFlag(func(f *adminFlags) *string { return &f.user }, "user", "a user's id: the one acted on, or the one acting (created_by)"),
	"workspace":         strFlag(func(f *adminFlags) *string { return &f.workspace }, "workspace", "a workspace's id"),
	"id":                strFlag(func(f *adminFlags) *string { return &f.id }, "id", "the id of what the command acts on (key, intern, issuer, policy, endpoint, delivery)"),
	"name":              strFlag(func(f *adminFlags) *string { return &f.name }, "name", "a name"),
	"slug":              strFlag(func(f *adminFlags) *string { return &f.slug }, "slug", "the workspace's slug"),
	"email":             strFlag(func(f *adminFlags) *string { return &f.email }, "email", "the user's email"),
	"role":              strFlag(func(f *adminFlags) *string { return &f.role }, "role", "the user's role: admin or member"),
	"kind":              strFlag(func(f *adminFlags) *string { return &f.kind }, "kind", "a key's kind (management, workspace, personal) or a claim check's (scopes, token_type)"),
	"model":             strFlag(func(f *adminFlags) *string { return &f.model }, "model", "the intern's model"),
	"agent":             strFlag(func(f *adminFlags) *string { return &f.agent }, "agent", "the agent the intern runs: a known or custom agent's name (docs/agents.md)"),
	"description":       strFlag(func(f *adminFlags) *string { return &f.description }, "description", "a description"),
	"url":               strFlag(func(f *adminFlags) *string { return &f.url }, "url", "a URL: a remote daemon's, or a webhook receiver's"),
	"secret-file":       strFlag(func(f *adminFlags) *string { return &f.secretFile }, "secret-file", "the file holding a remote daemon's secret"),
	"interns-programme": boolFlag(func(f *adminFlags) *bool { return &f.internsProgramme }, "interns-programme", "entitlement: the interns programme"),
	"workload-identity": boolFlag(func(f *adminFlags) *bool { return &f.workloadIdentity }, "workload-identity", "entitlement: workload identity federation"),
	"vault-writes":      boolFlag(func(f *adminFlags) *bool { return &f.vaultWrites }, "vault-writes", "entitlement: vault writes"),
	"own-limits":        func(fs *flag.FlagSet, e *adminEnv) { internLimitFlags(fs, e.f) },
	"issuer-url":        optFlag(func(f *adminFlags) *optString { return &f.issuerURL }, "issuer-url", "the issuer URL (https://, equal to the tokens' iss)"),
	"jwks-url":          optFlag(func(f *adminFlags) *optString { return &f.jwksURL }, "jwks-url", "the JWKS URL (empty: discovery)"),
	"subject":           optFlag(func(f *adminFlags) *optString { return &f.subject }, "subject", "the token sub a policy requires"),
	"audience":          optFlag(func(f *adminFlags) *optString { return &f.audience }, "audience", "the aud a policy requires"),
	"condition":         optFlag(func(f *adminFlags) *optString { return &f.condition }, "condition", "a CEL condition over subject, audience, scopes, token_type"),
	"api-key":           optFlag(func(f *adminFlags) *optString { return &f.apiKey }, "api-key", "the id of the workspace API key a policy acts as"),
	"enabled":           optFlag(func(f *adminFlags) *optString { return &f.enabled }, "enabled", "true or false (pause a policy or an endpoint)"),
	"issuer":            strFlag(func(f *adminFlags) *string { return &f.issuer }, "issuer", "an issuer's id"),
	"value":             strFlag(func(f *adminFlags) *string { return &f.value }, "value", "the claim check's value"),
	"scopes":            strFlag(func(f *adminFlags) *string { return &f.scopes }, "scopes", "claim check: the scopes claim must contain this"),
	"token-type":        strFlag(func(f *adminFlags) *string { return &f.tokenType }, "token-type", "claim check: the token_type claim must equal this"),
	"token":             strFlag(func(f *adminFlags) *string { return &f.token }, "token", "the subject token of a dry run"),
	"token-file":        strFlag(func(f *adminFlags) *string { return &f.tokenFile }, "token-file", "the file holding the subject token of a dry run"),
	"limit":             intFlagDef(func(f *adminFlags) *int { return &f.limit }, "limit", 50, "how many audit rows"),
	"events":            strFlag(func(f *adminFlags) *string { return &f.events }, "events", "comma-separated event types (run.paused,run.completed,run.failed,run.cancelled)"),
	"status":            strFlag(func(f *adminFlags) *string { return &f.status }, "status", "deliveries with this status only (pending, succeeded, failed)"),
	"page-size":         intFlagDef(func(f *adminFlags) *int { return &f.pageSize }, "page-size", 50, "how many deliveries"),
	// --agent is the intern's agent here; serve's --agent (a custom agent)
	// is read from its variable, COHORT_AGENTS, alone.
	"serve-agents": func(fs *flag.FlagSet, e *adminEnv) {
		declareExcept(fs, func(fs *flag.FlagSet) { agentFlags(fs, &e.cfg.Agents) }, "agent")
	},
	"serve-limits": func(fs *flag.FlagSet, e *adminEnv) {
		e.checks = append(e.checks, limitFlags(fs, &e.cfg.Fleet.Limits, "as serve's (the ceiling of an intern's own)"))
	},
	"serve-federation-egress": func(fs *flag.FlagSet, e *adminEnv) { federationEgressFlags(fs, &e.cfg.Federation) },
	"serve-webhook-egress":    func(fs *flag.FlagSet, e *adminEnv) { webhookEgressFlags(fs, &e.cfg.Webhooks) },
}

// declareExcept declares on fs what declare declares, but the flags named
// skip (their values stay as declare set them: from their variables).
func declareExcept(fs *flag.FlagSet, declare func(*flag.FlagSet), skip ...string) {
	all := flag.NewFlagSet("", flag.ContinueOnError)
	declare(all)
	all.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(skip, f.Name) {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
}

func strFlag(field func(*adminFlags) *string, name, usage string) func(*flag.FlagSet, *adminEnv) {
	return func(fs *flag.FlagSet, e *adminEnv) { fs.StringVar(field(e.f), name, "", usage) }
}

func boolFlag(field func(*adminFlags) *bool, name, usage string) func(*flag.FlagSet, *adminEnv) {
	return func(fs *flag.FlagSet, e *adminEnv) { fs.BoolVar(field(e.f), name, false, usage) }
}

func optFlag(field func(*adminFlags) *optString, name, usage string) func(*flag.FlagSet, *adminEnv) {
	return func(fs *flag.FlagSet, e *adminEnv) { fs.Var(field(e.f), name, usage) }
}

func intFlagDef(field func(*adminFlags) *int, name string, def int, usage string) func(*flag.FlagSet, *adminEnv) {
	return func(fs *flag.FlagSet, e *adminEnv) { fs.IntVar(field(e.f), name, def, usage) }
}

// flagSet is the command's own flag set, declared into a new env: the
// common flags and the ones it lists.
func (c adminCmd) flagSet(name string, out io.Writer) (*flag.FlagSet, *adminEnv) {
	e := &adminEnv{out: out, f: &adminFlags{}, cfg: config.Default()}
	fs := flag.NewFlagSet("cohort admin "+name, flag.ContinueOnError)
	adminCommonFlags(fs, e)
	for _, n := range c.flags {
		adminFlagDefs[n](fs, e)
	}
	return fs, e
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
	"org create": {"--name N [--interns-programme] [--workload-identity] [--vault-writes]", []string{"name", "interns-programme", "workload-identity", "vault-writes"}, func(ctx context.Context, e *adminEnv) error {
		o, err := e.acc.CreateOrganization(ctx, auth.Operator(""), &cohortv1.CreateOrganizationRequest{Name: e.f.name,
			Entitlements: &cohortv1.Entitlements{InternsProgramme: e.f.internsProgramme, WorkloadIdentity: e.f.workloadIdentity, VaultWrites: e.f.vaultWrites}})
		if err != nil {
			return err
		}
		return e.printOne(o)
	}},
	"org list": {"", []string{}, func(ctx context.Context, e *adminEnv) error {
		os, err := e.acc.ListOrganizations(ctx, auth.Operator(""))
		if err != nil {
			return err
		}
		return e.print(protos(os)...)
	}},
	"org entitlements": {"--org ID [--interns-programme] [--workload-identity] [--vault-writes] (sets all three)", []string{"org", "interns-programme", "workload-identity", "vault-writes"}, func(ctx context.Context, e *adminEnv) error {
		o, err := e.acc.SetEntitlements(ctx, auth.Operator(""), e.f.org,
			&cohortv1.Entitlements{InternsProgramme: e.f.internsProgramme, WorkloadIdentity: e.f.workloadIdentity, VaultWrites: e.f.vaultWrites})
		if err != nil {
			return err
		}
		return e.printOne(o)
	}},
	"user create": {"--org ID --email E [--name N] [--role admin|member]", []string{"org", "user", "email", "name", "role"}, func(ctx context.Context, e *adminEnv) error {
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
	"user list": {"--org ID", []string{"org", "user"}, func(ctx context.Context, e *adminEnv) error {
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
	"user left": {"--org ID --user ID   (mark a user as having left)", []string{"org", "user"}, func(ctx context.Context, e *adminEnv) error {
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
	"grant create": {"--org ID --user ID [--workspace ID]", []string{"org", "user", "workspace"}, func(ctx context.Context, e *adminEnv) error {
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
	"key create": {"--org ID --user ID --kind management|workspace|personal [--workspace ID] [--name N]", []string{"org", "user", "kind", "workspace", "name"}, func(ctx context.Context, e *adminEnv) error {
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
	"key list": {"--org ID [--workspace ID]", []string{"org", "user", "workspace"}, func(ctx context.Context, e *adminEnv) error {
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
	"key disable": {"--org ID --id KEY_ID", []string{"org", "user", "id"}, keyState((*accounts.Service).DisableAPIKey)},
	"key enable":  {"--org ID --id KEY_ID", []string{"org", "user", "id"}, keyState((*accounts.Service).EnableAPIKey)},
	"key delete":  {"--org ID --id KEY_ID", []string{"org", "user", "id"}, keyState((*accounts.Service).DeleteAPIKey)},
	"workspace create": {"--org ID --user ID --name N [--slug S] [--description D]", []string{"org", "user", "name", "slug", "description"}, func(ctx context.Context, e *adminEnv) error {
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
	"workspace list": {"--org ID", []string{"org", "user"}, func(ctx context.Context, e *adminEnv) error {
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
	"intern create": {"--org ID --workspace ID --name N [--model M] [--agent A] [--user ID] [limits]", []string{"org", "user", "workspace", "name", "model", "agent", "own-limits", "serve-agents", "serve-limits"}, func(ctx context.Context, e *adminEnv) error {
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
	"intern list": {"--org ID --workspace ID", []string{"org", "user", "workspace"}, func(ctx context.Context, e *adminEnv) error {
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
	"intern register": {"--id INTERN_ID --url URL --secret-file FILE   (a remote daemon: cohort serve --provisioner remote)", []string{"id", "url", "secret-file"}, internRegister},
	"intern get":      {"--org ID --id INTERN_ID", []string{"org", "user", "id"}, internOp((*interns.Service).Get)},
	"intern suspend":  {"--org ID --id INTERN_ID", []string{"org", "user", "id"}, internOp((*interns.Service).Suspend)},
	"intern resume":   {"--org ID --id INTERN_ID", []string{"org", "user", "id"}, internOp((*interns.Service).Resume)},
	"intern delete":   {"--org ID --id INTERN_ID", []string{"org", "user", "id"}, internOp((*interns.Service).Delete)},
	"intern update": {"--org ID --id INTERN_ID [--name N] [--model M] [--agent A] [limits, 0: the operator's]", []string{"org", "user", "id", "name", "model", "agent", "own-limits", "serve-agents", "serve-limits"}, func(ctx context.Context, e *adminEnv) error {
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
	"vault audit":      {"--org ID [--id INTERN_ID]  the vault's release decisions, newest first (at most 1000; never values)", []string{"org", "user", "id"}, vaultAudit},
	"vault rotate-kek": {"[--kek-file F]  new KEK primary key; re-wrap every vault's data keys (ciphertexts untouched, no downtime)", []string{}, vaultRotateKEK},
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
	fmt.Fprintln(w, "Usage: cohort admin [common flags] <noun> <verb> [flags]\n\nCommands:")
	names := slices.Sorted(maps.Keys(adminCmds))
	for _, n := range names {
		fmt.Fprintf(w, "  %-18s %s\n", n, adminCmds[n].help)
	}
	fmt.Fprintln(w, `
Common flags (before or after the command): --data-dir, --database-url, --kek-file (as for serve), --json.
The database must exist (cohort serve or cohort migrate made it); --init creates it,
and the data directory and key-encryption key, when missing.
Run "cohort admin <noun> <verb> -h" for a command's flags.`)
}

// parseInterspersed parses flags wherever they stand among args and returns
// the other words in order: the standard flag package stops at the first
// word.
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

// adminWords finds the command's two words among args (`admin --data-dir X
// org list` and `admin org list --data-dir X` both) and returns them and
// the flags around them. Flags before the words are parsed, to be skipped,
// with every admin flag declared; the command's own set parses them all
// again.
func adminWords(args []string, stderr io.Writer) (words, flags []string, err error) {
	fs := flag.NewFlagSet("cohort admin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// A mistyped flag gets its error and a pointer, not every command.
	fs.Usage = func() {
		fmt.Fprintln(stderr, `Run "cohort admin help" for the commands, "cohort admin <noun> <verb> -h" for one's flags.`)
	}
	e := &adminEnv{f: &adminFlags{}, cfg: config.Default()}
	adminCommonFlags(fs, e)
	for _, declare := range adminFlagDefs {
		declare(fs, e)
	}
	for len(words) < 2 {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		flags = append(flags, args[:len(args)-fs.NArg()]...)
		if fs.NArg() == 0 {
			return words, flags, nil
		}
		words, args = append(words, fs.Arg(0)), fs.Args()[1:]
		if words[0] == "help" {
			break
		}
	}
	return words, append(flags, args...), nil
}

func admin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	words, flags, err := adminWords(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		adminUsage(stdout)
		fmt.Fprintln(stdout, "\nCommon flags:")
		fs := flag.NewFlagSet("cohort admin", flag.ContinueOnError)
		adminCommonFlags(fs, &adminEnv{cfg: config.Default()})
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
	fs, e := cmd.flagSet(name, stdout)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	rest, err := parseInterspersed(fs, flags)
	if errors.Is(err, flag.ErrHelp) {
		adminCmdUsage(stdout, name, cmd, fs)
		return nil
	}
	if err != nil {
		fmt.Fprintf(stderr, "Run \"cohort admin %s -h\" for its flags.\n", name)
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("unexpected argument %q", rest[0])
	}
	for _, check := range e.checks {
		if err := check(); err != nil {
			return err
		}
	}
	catalog, err := e.cfg.Agents.Catalog()
	if err != nil {
		return err
	}
	db, err := openAdminDB(ctx, e.cfg.Store, e.init)
	if err != nil {
		return err
	}
	defer db.Close()
	e.db = db
	e.acc = &accounts.Service{DB: db}
	e.ws = &workspaces.Service{DB: db}
	// The operator's limits are the ceiling of an intern's own.
	e.in = &interns.Service{DB: db, Agents: catalog, Ceiling: e.cfg.Fleet.Limits}
	return cmd.run(ctx, e)
}

// adminCmdUsage is `cohort admin NOUN VERB -h`: the command's flags alone.
func adminCmdUsage(w io.Writer, name string, cmd adminCmd, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: cohort admin %s [flags]\n\n  %s\n\nFlags:\n", name, cmd.help)
	fs.SetOutput(w)
	fs.PrintDefaults()
}
