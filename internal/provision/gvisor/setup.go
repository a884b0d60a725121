package gvisor

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
)

func init() { provision.Register(kind{}) }

// Package is the Debian package that installs runsc, named by every
// failure to find or run it.
const Package = "runsc"

type kind struct{}

func (kind) Name() string { return Name }
func (kind) Usage() string {
	return "the gateway runs each intern's daemon in a gVisor sandbox on this machine (runsc, an application kernel: a second wall beside the jail's)"
}

// Flags are gvisor's own settings beside the jail's (localjail.JailFlags:
// the sandbox holds the same jail, ADR 0981).
func (kind) Flags(fs *flag.FlagSet) provision.Setup {
	s := &setup{jailFlags: localjail.JailFlagsOn(fs)}
	config.StringVar(fs, &s.runsc, "gvisor-runsc", "runsc", "with --provisioner gvisor, the runsc binary (Debian: apt-get install "+Package+")")
	config.StringVar(fs, &s.platform, "gvisor-platform", "", "with --provisioner gvisor, runsc's --platform (default: runsc's own: systrap on releases since 2023, ptrace on Debian's 2022 one); kvm needs /dev/kvm")
	return s
}

// setup brings up the sandboxes of local interns: their relays and a
// probe that this machine can start them, before anything is written.
type setup struct {
	jailFlags       *localjail.JailFlags
	runsc, platform string
	binary          string
	jail            *localjail.JailConfig
	relay           *egress.Relay
}

// Check fails closed when runsc is missing or cannot start a sandbox
// here; what it writes (runsc's state of one throwaway sandbox) is in a
// temporary directory it removes.
func (s *setup) Check(config.Config) error {
	if s.jailFlags.UnsafeShared() {
		return errors.New("--unsafe-shared-host runs interns unjailed; --provisioner gvisor always sandboxes them: drop one of the two")
	}
	if err := s.jailFlags.Check(); err != nil {
		return err
	}
	platform, err := CheckRunsc(s.runsc, s.platform)
	s.platform = platform
	return err
}

// platformArgs is runsc's --platform flag, none for runsc's own default.
func platformArgs(platform string) []string {
	if platform == "" {
		return nil
	}
	return []string{"--platform", platform}
}

// CheckRunsc checks that runsc is there and starts a sandbox on platform,
// and returns the platform (for an empty one, runsc's default, which the
// release decides: systrap since 2023, ptrace on Debian's 2022 one).
func CheckRunsc(runsc, platform string) (string, error) {
	path, err := exec.LookPath(runsc)
	if err != nil {
		return "", fmt.Errorf("--provisioner gvisor needs runsc (gVisor), which is not installed (%v): install it (Debian: apt-get install %s), or set --gvisor-runsc", err, Package)
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("--provisioner gvisor runs runsc, which needs root here: run the gateway as root (runsc %s)", path)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if platform == "" {
		platform = defaultPlatform(ctx, path)
	}
	dir, err := os.MkdirTemp("", "cohort-gvisor-check-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, path, append(platformArgs(platform), "--root", dir, "--network=none", "do", "/bin/true")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("--provisioner gvisor: runsc (%s, package %s) could not start a sandbox on the %s platform: %v: %s", path, Package, cmp.Or(platform, "default"), err, strings.TrimSpace(string(out)))
	}
	return platform, nil
}

// defaultPlatform reads runsc's default --platform from its flag list
// (`-platform string … (default "systrap")`); empty if it does not say.
func defaultPlatform(ctx context.Context, runsc string) string {
	out, _ := exec.CommandContext(ctx, runsc, "flags").CombinedOutput()
	_, rest, ok := strings.Cut(string(out), "-platform string")
	if !ok {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimLeft(rest, "\n"), "\n")
	_, def, ok := strings.Cut(line, `(default "`)
	if !ok {
		return ""
	}
	def, _, _ = strings.Cut(def, `"`)
	return def
}

func (s *setup) Prepare(ctx context.Context, env provision.Env) (func(), error) {
	cfg := env.Config
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	env.Log.Info("gvisor sandboxes", "runsc", s.runsc, "platform", s.platform)
	s.binary = s.jailFlags.Binary(ctx, self, env.Log)
	if err := os.MkdirAll(cfg.Store.DataDir, 0o700); err != nil {
		return nil, err
	}
	if s.jail, s.relay, err = s.jailFlags.InternJail(cfg, env.Listen, env.Log); err != nil {
		return nil, err
	}
	if err := s.backend(env, provision.Agents{}).Probe(ctx); err != nil {
		s.relay.Close()
		return nil, err
	}
	return func() { s.relay.Close() }, nil
}

func (s *setup) Backend(env provision.Env, _ *provision.Provisioner, ag provision.Agents) (provision.Backend, error) {
	if s.jail == nil {
		return nil, errors.New("server: the gvisor provisioner's setup makes its sandboxes' relays in Prepare")
	}
	if env.SecretsDoor != nil {
		// The sandboxes trust the proxy CA's certificate; its key stays in
		// the gateway (ADR 0931).
		ca, door, err := env.SecretsDoor()
		if err != nil {
			return nil, err
		}
		s.jail.ProxyCA = ca
		s.relay.SetSecrets(door)
	}
	return s.backend(env, ag), nil
}

func (s *setup) backend(env provision.Env, ag provision.Agents) *Backend {
	cfg := env.Config
	j := &localjail.Backend{DataDir: cfg.Store.DataDir, Agents: ag, InteractionDeadline: cfg.Chat.InteractionDeadline,
		HTTPToolCAFile: s.jailFlags.ToolCAFile(), Jail: s.jail, GatewayURL: env.GatewayURL}
	if s.binary != "" {
		j.Command = []string{s.binary}
	}
	return &Backend{Jail: j, Runsc: s.runsc, Platform: s.platform}
}

func (s *setup) Routes(api http.Handler) http.Handler { return api }

// Serve: each sandbox's gateway relay serves the API in process.
func (s *setup) Serve(h http.Handler) {
	if s.relay != nil {
		s.relay.SetGateway(h)
	}
}

func (s *setup) Observe(provision.Hooks) {}

// Warnings: none; every limit holds in a sandbox (the processes' as
// RLIMIT_NPROC, counted by the Sentry: bundle.go).
func (s *setup) Warnings() []string { return nil }

func (s *setup) Unsafe() string             { return "" }
func (s *setup) WakeTimeout() time.Duration { return 0 }

// Probe starts a sandbox as every intern's is started, whose program is
// the daemon's binary's `version`: the init, the binds and runsc work
// here. The error names the package.
func (b *Backend) Probe(ctx context.Context) (err error) {
	dir, err := os.MkdirTemp("", "cohort-gvisor-probe-")
	if err != nil {
		return err
	}
	defer func() {
		// What runsc leaves mounted there (ADR 0997) would keep it.
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = fmt.Errorf("gvisor probe: %w", rerr)
		}
	}()
	pb := &Backend{Jail: &localjail.Backend{DataDir: dir, Command: b.Jail.Command, Agents: b.Jail.Agents, Jail: b.Jail.Jail},
		Runsc: b.Runsc, Platform: b.Platform, Init: b.Init}
	dj, err := pb.DaemonJail(provision.Spec{ID: "probe", Limits: config.InternLimits{}}, pb.internDir("probe"))
	if err != nil {
		return err
	}
	js := dj.Spec()
	js.Argv = []string{js.Argv[0], "version"}
	js.Relays = nil
	sb := pb.sandbox("probe")
	init, err := pb.init()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(pb.internDir("probe"), 0o700); err != nil {
		return err
	}
	if err := ownDir(pb.internDir("probe"), js.UID, js.GID); err != nil {
		return err
	}
	if err := sb.write(js, init, ""); err != nil {
		return err
	}
	if err := os.MkdirAll(pb.stateDir(), 0o700); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cid := pb.containerID("probe")
	cmd := pb.runsc("run", "--bundle", sb.bundle(), cid)
	cmd = exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	out, err := cmd.CombinedOutput()
	pb.destroy(cid)
	pb.unpinNetNS()
	if err != nil {
		return fmt.Errorf("this machine cannot start interns' gVisor sandboxes (runsc, package %s): %v: %s", Package, err, strings.TrimSpace(string(out)))
	}
	return nil
}
