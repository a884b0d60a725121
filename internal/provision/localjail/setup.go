package localjail

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

func init() { provision.RegisterDefault(kind{}) }

// UnsafeSharedHostWarning is logged at start and reported by /readyz when
// local interns run unjailed.
const UnsafeSharedHostWarning = "--unsafe-shared-host: interns run unjailed as the gateway's user on its host; anyone holding a workspace key can read the gateway's keys, database and other interns"

type kind struct{}

func (kind) Name() string { return Name }
func (kind) Usage() string {
	return "the gateway runs each intern's daemon in a jail on this machine"
}

// Flags are the settings of --provisioner local (ADR 0961): the jails'
// own (JailFlags). The limits of each jail are the fleet's
// (config.Fleet.Limits), the ceiling of every backend's interns.
func (kind) Flags(fs *flag.FlagSet) provision.Setup {
	return &setup{flags: JailFlagsOn(fs)}
}

// JailFlags are the settings of the jail every local intern runs in, which
// another backend that holds the same jail in another wall (gvisor) reads
// too: declared once on a flag set (JailFlagsOn), checked once (Check).
type JailFlags struct {
	unsafeShared                                        *bool
	egressAllow, toolCA, internBinary, readOnly, orphan *string

	// What Check makes of them.
	allow         *safehttp.Allowlist
	toolCAFile    string
	orphanTimeout time.Duration
}

// jailFlags are the JailFlags declared on each flag set, so that every
// kind that reads them shares one declaration.
var jailFlags sync.Map // *flag.FlagSet → *JailFlags

// JailFlagsOn declares the jails' flags on fs, or returns those already
// declared there.
func JailFlagsOn(fs *flag.FlagSet) *JailFlags {
	if f, ok := jailFlags.Load(fs); ok {
		return f.(*JailFlags)
	}
	f := &JailFlags{
		unsafeShared: new(bool),
		egressAllow:  config.String(fs, "intern-egress-allow-hosts", "", "comma-separated hostnames, addresses and ranges on private networks (api.internal,10.0.0.0/8) that jailed interns may reach, with http_request say; loopback only by range, 169.254.169.254 never"),
		toolCA:       config.String(fs, "http-tool-ca-file", "", "PEM certificates the interns' http_request tool trusts besides the system roots: a company CA"),
		internBinary: config.String(fs, "intern-binary", "", "with local or gvisor, the binary interns run from (their jail's init, daemon and built-in agent): a cohort-intern of this same build; default: cohort-intern beside this executable if it is there, else this executable; another build is refused, with a warning"),
		readOnly:     config.String(fs, "jail-ro-bind", "", "comma-separated host paths bound read-only into every intern's jail, besides /usr, /bin, /lib and /etc"),
		orphan:       config.String(fs, "jail-orphan-timeout", (10 * time.Minute).String(), "with local, how long interns' jails run on after the gateway stops (a restart adopts them, runs and paused runs intact); 0 stops them with it"),
	}
	config.BoolVar(fs, f.unsafeShared, "unsafe-shared-host", false, "run local interns unjailed, as this user on this host, where the machine cannot make jails: anyone with a workspace key can then read the gateway's keys")
	jailFlags.Store(fs, f)
	return f
}

// UnsafeShared reports --unsafe-shared-host.
func (f *JailFlags) UnsafeShared() bool { return *f.unsafeShared }

// ToolCAFile is --http-tool-ca-file made absolute, once checked.
func (f *JailFlags) ToolCAFile() string { return f.toolCAFile }

// Binary is the binary interns run from (--intern-binary, else found
// beside self).
func (f *JailFlags) Binary(ctx context.Context, self string, log *slog.Logger) string {
	return InternBinary(ctx, *f.internBinary, self, log)
}

// setup brings up the jails of local interns: their relays and a probe
// that this machine can make them, before anything is written.
type setup struct {
	flags *JailFlags

	binary string
	jail   *JailConfig
	relay  *egress.Relay
	unsafe bool
}

func (s *setup) Check(config.Config) error { return s.flags.Check() }

// Check checks the jails' settings, each once, naming the flag.
func (f *JailFlags) Check() error {
	var err error
	if f.allow, err = safehttp.ParseAllowlist(config.SplitList(*f.egressAllow)); err != nil {
		return fmt.Errorf("%s: %w", config.Setting("intern-egress-allow-hosts"), err)
	}
	if f.toolCAFile = *f.toolCA; f.toolCAFile != "" {
		if f.toolCAFile, err = filepath.Abs(f.toolCAFile); err == nil {
			_, err = safehttp.ExtraRootsFromFile(f.toolCAFile)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", config.Setting("http-tool-ca-file"), err)
		}
	}
	if f.orphanTimeout, err = time.ParseDuration(*f.orphan); err != nil || f.orphanTimeout < 0 {
		return fmt.Errorf("%s: %q is not a duration such as 10m or 30s (0 stops jails with the gateway)", config.Setting("jail-orphan-timeout"), *f.orphan)
	}
	return nil
}

func (s *setup) Prepare(ctx context.Context, env provision.Env) (func(), error) {
	cfg := env.Config
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s.binary = s.flags.Binary(ctx, self, env.Log)
	if s.flags.UnsafeShared() {
		return func() {}, nil
	}
	// The data directory exists before the jail's hidden paths are
	// resolved (through symlinks too); it is created empty.
	if err := os.MkdirAll(cfg.Store.DataDir, 0o700); err != nil {
		return nil, err
	}
	if s.jail, s.relay, err = s.flags.InternJail(cfg, env.Listen, env.Log); err != nil {
		return nil, err
	}
	checkDescriptors(env.Log, cfg.Fleet.MaxAwake, s.relay.MaxConnsPerIntern())
	if err := probe(s.backend(env, provision.Agents{})); err != nil {
		s.relay.Close()
		return nil, err
	}
	return func() { s.relay.Close() }, nil
}

func (s *setup) Backend(env provision.Env, _ *provision.Provisioner, ag provision.Agents) (provision.Backend, error) {
	if s.jail == nil && !s.flags.UnsafeShared() {
		return nil, errors.New("server: the local provisioner jails every intern (its setup's Prepare makes the jail) unless --unsafe-shared-host allows otherwise")
	}
	s.unsafe = s.jail == nil
	if s.jail != nil && env.SecretsDoor != nil {
		// The jails trust the proxy CA's certificate; its key stays in
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

// backend is the local jails' backend of these settings.
func (s *setup) backend(env provision.Env, ag provision.Agents) *Backend {
	cfg := env.Config
	b := &Backend{DataDir: cfg.Store.DataDir, Agents: ag, InteractionDeadline: cfg.Chat.InteractionDeadline,
		HTTPToolCAFile: s.flags.toolCAFile, Jail: s.jail, GatewayURL: env.GatewayURL}
	if bin := cmp.Or(s.binary, *s.flags.internBinary); bin != "" {
		b.Command = []string{bin}
	}
	return b
}

func (s *setup) Routes(api http.Handler) http.Handler { return api }

// Serve: each jail's gateway relay serves the API in process, the intern
// named in each request (the exchange limiter keys on it).
func (s *setup) Serve(h http.Handler) {
	if s.relay != nil {
		s.relay.SetGateway(h)
	}
}

func (s *setup) Observe(provision.Hooks) {}

func (s *setup) Warnings() []string {
	if s.jail == nil {
		return nil
	}
	jail.SweepCgroups()
	return LimitWarnings(s.jail.Limits)
}

func (s *setup) Unsafe() string {
	if s.unsafe {
		return UnsafeSharedHostWarning
	}
	return ""
}

func (s *setup) WakeTimeout() time.Duration { return 0 }

func probe(b *Backend) error {
	if err := b.ProbeJail(); err != nil {
		return fmt.Errorf("%w\n%s", err, Remedy(err))
	}
	return nil
}

// InternJail is the jail of every intern, of the checked settings. Its
// relays are open until the caller closes them.
func (f *JailFlags) InternJail(cfg config.Config, gw net.Addr, log *slog.Logger) (*JailConfig, *egress.Relay, error) {
	gwAddr := gw.String()
	if host, port, err := net.SplitHostPort(gwAddr); err == nil {
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			gwAddr = net.JoinHostPort("127.0.0.1", port)
		}
	}
	var toolCA []byte
	if f.toolCAFile != "" {
		var err error
		if toolCA, err = os.ReadFile(f.toolCAFile); err != nil {
			return nil, nil, fmt.Errorf("--http-tool-ca-file: %w", err)
		}
	}
	traces, tracesHeaders := "", http.Header(nil)
	if telemetry.Enabled() {
		traces, tracesHeaders = telemetry.TracesEndpoint()
	}
	relay, err := egress.New(egress.Config{GatewayAddr: gwAddr, ModelBaseURL: cfg.Agents.BaseURL, ModelAPIKey: cfg.Agents.APIKey,
		Placeholder: agents.KeyPlaceholder, Internet: true, Allow: f.allow, TracesURL: traces, TracesHeaders: tracesHeaders,
		UpstreamRoots: pemCerts(toolCA), Log: log.With("component", "egress")})
	if err != nil {
		return nil, nil, fmt.Errorf("model endpoint (COHORT_AGENT_BASE_URL): %w", err)
	}
	jc := &JailConfig{Relay: relay, AgentEnv: cfg.Agents.Env, ReadOnly: config.SplitList(*f.readOnly), HTTPToolCA: string(toolCA), Traces: traces != "",
		Orphan: f.orphanTimeout, Limits: Limits(cfg.Fleet.Limits),
		Hide: HiddenPaths(append([]string{cfg.Store.DataDir, cfg.Store.KEKPath(), cfg.Store.SQLitePath()}, BinaryDir()...)...)}
	if cfg.Agents.APIKey != "" {
		jc.ModelKeyPlaceholder = agents.KeyPlaceholder
	}
	if err := jc.Check(); err != nil {
		relay.Close()
		return nil, nil, err
	}
	return jc, relay, nil
}

// Limits is what the jail enforces of an operator's limits.
func Limits(l config.InternLimits) jail.Limits {
	return jail.Limits{Memory: l.Memory, Pids: l.Processes, CPUWeight: l.CPUWeight, CPUs: l.CPUs, Tmpfs: l.Tmpfs, FileSize: l.Disk}
}

// gatewayReserve is what of the gateway's descriptors is kept for
// everything but the jails' relays: its listener's clients, the database,
// the log, the provisioner's pipes and control sockets.
const gatewayReserve = 4096

// descriptorBudget says whether the jails' relays, each intern at its cap
// (perIntern connections of egress.FDsPerConn descriptors), fit under
// nofile beside gatewayReserve: with maxAwake interns (0: no cap) and how
// many interns fit.
func descriptorBudget(nofile uint64, maxAwake, perIntern int) (fit uint64, ok bool) {
	each := uint64(perIntern * egress.FDsPerConn)
	if nofile > gatewayReserve {
		fit = (nofile - gatewayReserve) / each
	}
	return fit, maxAwake > 0 && uint64(maxAwake) <= fit
}

// checkDescriptors raises the gateway's descriptor limit (soft to hard)
// and logs it beside what the jails' relays can take of it; a warning
// when max-awake-interns at their cap would not fit, or when it is unset.
func checkDescriptors(log *slog.Logger, maxAwake, perIntern int) {
	nofile, err := egress.RaiseFileLimit()
	if err != nil {
		log.Warn("descriptors: RLIMIT_NOFILE could not be read or raised", "err", err)
		return
	}
	fit, ok := descriptorBudget(nofile, maxAwake, perIntern)
	attrs := []any{"nofile", nofile, "relay_conns_per_intern", perIntern, "fds_per_intern", perIntern * egress.FDsPerConn,
		"max_awake_interns", maxAwake, "interns_at_cap_that_fit", fit, "reserve", gatewayReserve}
	if ok {
		log.Info("descriptors: every awake intern at its relay cap fits", attrs...)
		return
	}
	log.Warn("descriptors: awake interns at their relay cap could exhaust the gateway's descriptors; set --max-awake-interns to at most interns_at_cap_that_fit, or raise the hard RLIMIT_NOFILE (systemd LimitNOFILE=)", attrs...)
}

// BinaryDir is the directory of this binary, unless it is a system one
// (/usr/local/bin…) whose other programs interns may need: the binary
// itself is bound into each jail on its own.
func BinaryDir() []string {
	self, err := os.Executable()
	if err != nil {
		return nil
	}
	dir := filepath.Dir(self)
	for _, sys := range []string{"/usr/", "/bin", "/sbin", "/opt/"} {
		if strings.HasPrefix(dir+"/", sys) {
			return nil
		}
	}
	return []string{dir}
}

// pemCerts are the certificates of a PEM file (others' blocks skipped).
func pemCerts(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return out
		}
		if c, err := x509.ParseCertificate(blk.Bytes); err == nil && blk.Type == "CERTIFICATE" {
			out = append(out, c)
		}
	}
}
