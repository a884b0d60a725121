package main

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/cohort-dev/cohort/internal/config"
)

// flagGroup is a heading of a command's help and the flags under it.
type flagGroup struct {
	title string
	names []string
}

// serveGroups orders `cohort serve -h` by what an operator is setting up.
// Every serve flag is in one group (TestServeHelpGroupsEveryFlag).
var serveGroups = []flagGroup{
	{"Server", []string{"listen", "log-level", "shutdown-timeout", "metrics-listen", "regional-hosts", "cors-allow-origins", "no-bootstrap"}},
	{"Storage and keys", []string{"data-dir", "database-url", "kek-file", "redis-url"}},
	{"Interns", []string{"provisioner", "intern-idle-timeout", "intern-start-concurrency", "max-awake-interns", "interaction-deadline", "jail-orphan-timeout", "jail-ro-bind", "intern-egress-allow-hosts", "http-tool-ca-file", "intern-binary", "unsafe-shared-host"}},
	{"Limits of each intern's jail (--provisioner local)", []string{"intern-memory", "intern-max-processes", "intern-cpu-weight", "intern-cpus", "intern-tmpfs", "intern-disk"}},
	{"Kubernetes (--provisioner kubernetes; docs/kubernetes.md)", []string{"kube-config", "kube-namespace", "kube-image", "kube-gateway-url", "kube-cpu-request", "kube-memory-request", "kube-cpu-limit", "kube-memory-limit", "kube-storage-size", "kube-tmp-size", "kube-storage-class", "kube-wake-timeout", "kube-agent-modules", "kube-runtime-class"}},
	{"gVisor (--provisioner gvisor; ADR 0981)", []string{"gvisor-runsc", "gvisor-platform"}},
	{"Agents", []string{"agent", "agent-auth-method", "agent-command", "agent-endpoint", "agent-modules"}},
	{"Chat", []string{"chat-keepalive", "first-event-timeout", "event-timeout", "turn-timeout", "turn-rate"}},
	{"Background runs (docs/background.md)", []string{"background-max-running", "background-event-bytes", "background-retention", "background-lease"}},
	{"Federation", []string{"token-issuer", "exchange-rate", "extra-ca-file", "federation-allow-hosts"}},
	{"Webhooks", []string{"webhook-allow-hosts", "webhook-lease"}},
}

// groupedUsage prints fs's flags under groups' headings; a flag no group
// names goes under "Other", so none is ever hidden.
func groupedUsage(fs *flag.FlagSet, command string, groups []flagGroup) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: cohort %s [flags]\n\nEvery flag can also be set by the COHORT_* variable its text names; a flag wins over its variable.\n", command)
		seen := map[string]bool{}
		print := func(title string, names []string) {
			var b strings.Builder
			for _, n := range names {
				f := fs.Lookup(n)
				if f == nil || seen[n] {
					continue
				}
				seen[n] = true
				kind, text := flag.UnquoteUsage(f)
				fmt.Fprintf(&b, "  -%s", f.Name)
				if kind != "" {
					fmt.Fprintf(&b, " %s", kind)
				}
				fmt.Fprintf(&b, "\n    \t%s", strings.ReplaceAll(text, "\n", "\n    \t"))
				if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" {
					fmt.Fprintf(&b, " (default %q)", f.DefValue)
				}
				b.WriteString("\n")
			}
			if b.Len() > 0 {
				fmt.Fprintf(w, "\n%s:\n%s", title, b.String())
			}
		}
		for _, g := range groups {
			print(g.title, g.names)
		}
		var rest []string
		fs.VisitAll(func(f *flag.Flag) {
			if !seen[f.Name] {
				rest = append(rest, f.Name)
			}
		})
		print("Other", rest)
	}
}

// envOfUsage is the COHORT_* variable a flag's usage names (the last one
// it names), and the usage without a closing "(COHORT_…)" that only
// names it.
func envOfUsage(usage string) (variable, text string) {
	vars := envName.FindAllString(usage, -1)
	if len(vars) == 0 {
		return "", usage
	}
	variable = vars[len(vars)-1]
	return variable, strings.TrimSpace(strings.TrimSuffix(usage, "("+variable+")"))
}

var envName = regexp.MustCompile(`COHORT_[A-Z0-9_]+`)

// hostDefaults are defaults computed on the host at start: the reference
// names the rule, not this machine's value.
var hostDefaults = map[string]string{
	"intern-cpus": "the host's CPUs but one (at least 1)",
}

// flagReference is the reference table of fs's flags by group, in
// Markdown, as docs/configuration.md holds it (TestFlagReferenceIsFresh).
func flagReference(fs *flag.FlagSet, groups []flagGroup) string {
	var b strings.Builder
	for _, g := range groups {
		fmt.Fprintf(&b, "\n### %s\n\n| flag | variable | default | meaning |\n|---|---|---|---|\n", g.title)
		for _, n := range g.names {
			if f := fs.Lookup(n); f != nil {
				b.WriteString(flagRow(f))
			}
		}
	}
	return b.String()
}

// flagRow is a flag's row of a reference table.
func flagRow(f *flag.Flag) string {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	variable, text := envOfUsage(f.Usage)
	if variable == "" {
		variable = "—"
	} else {
		variable = "`" + variable + "`"
	}
	def := "`" + f.DefValue + "`"
	switch {
	case hostDefaults[f.Name] != "":
		def = hostDefaults[f.Name]
	case f.DefValue == "" || f.DefValue == "[]":
		def = "empty"
	}
	return fmt.Sprintf("| `--%s` | %s | %s | %s |\n", f.Name, variable, cell(def), cell(text))
}

// adminReference is the reference of the admin commands and their flags,
// in Markdown, as docs/operations.md holds it (TestAdminReferenceIsFresh):
// which flags each command takes (its own set: `cohort admin NOUN VERB
// -h`), then what each flag means.
func adminReference() string {
	cmds := adminCmds()
	common := flag.NewFlagSet("common", flag.ContinueOnError)
	adminCommonFlags(common, &adminEnv{f: &adminFlags{}, cfg: config.Default()})
	var b strings.Builder
	b.WriteString("\n| command | its flags, besides the common ones |\n|---|---|\n")
	flags := map[string]*flag.Flag{}
	for _, name := range slices.Sorted(maps.Keys(cmds)) {
		fs, _ := cmds[name].flagSet(name, io.Discard)
		var own []string
		fs.VisitAll(func(f *flag.Flag) {
			if common.Lookup(f.Name) == nil {
				flags[f.Name] = f
				own = append(own, "`--"+f.Name+"`")
			}
		})
		fmt.Fprintf(&b, "| `%s` | %s |\n", name, strings.Join(own, " "))
	}
	b.WriteString("\nThe common flags, which every command takes:\n\n| flag | variable | default | meaning |\n|---|---|---|---|\n")
	common.VisitAll(func(f *flag.Flag) { b.WriteString(flagRow(f)) })
	b.WriteString("\nThe commands' flags (those with a variable are serve's own settings, read the same way):\n\n| flag | variable | default | meaning |\n|---|---|---|---|\n")
	for _, n := range slices.Sorted(maps.Keys(flags)) {
		b.WriteString(flagRow(flags[n]))
	}
	return b.String()
}
