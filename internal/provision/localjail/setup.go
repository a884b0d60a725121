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
	"time"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

func init() { provision.Register(kind{}) }

// UnsafeSharedHostWarning is logged at start and reported by /readyz when
// local interns run unjailed.
const UnsafeSharedHostWarning = "--unsafe-shared-host: interns run unjailed as the gateway's user on its host; anyone holding a workspace key can read the gateway's keys, database and other interns"

type kind struct{}

func (kind) Name() string { return Name }
func (kind) Usage() string {
	return "the gateway runs each intern's daemon in a jail on this machine"
}

// Flags: the local backend's settings are the configuration's own (they
// predate the registry and `intern --jail` shares them).
func (kind) Flags(*flag.FlagSet) provision.Setup { return &setup{} }

// setup brings up the jails of local interns: their relays and a probe
// that this machine can make them, before anything is written.
type setup struct {
	binary string
	jail   *JailConfig
	relay  *egress.Relay
	unsafe bool
}

func (s *setup) Check(config.Config) error { return nil }

func (s *setup) Prepare(ctx context.Context, env provision.Env) (func(), error) {
	cfg := env.Config
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s.binary = InternBinary(ctx, cfg.InternBinary, self, env.Log)
	if cfg.UnsafeSharedHost {
		return func() {}, nil
	}
	// The data directory exists before the jail's hidden paths are
	// resolved (through symlinks too); it is created empty.
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	if s.jail, s.relay, err = internJail(cfg, env.Listen, env.Log); err != nil {
		return nil, err
	}
	checkDescriptors(env.Log, cfg.MaxAwakeInterns, s.relay.MaxConnsPerIntern())
	if err := probe(s.backend(env, provision.Agents{})); err != nil {
		s.relay.Close()
		return nil, err
	}
	return func() { s.relay.Close() }, nil
}

func (s *setup) Backend(env provision.Env, _ *provision.Provisioner, ag provision.Agents) (provision.Backend, error) {
	if s.jail == nil && !env.Config.UnsafeSharedHost {
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
	b := &Backend{DataDir: cfg.DataDir, Agents: ag, InteractionDeadline: cfg.InteractionDeadline,
		HTTPToolCAFile: cfg.HTTPToolCAFile, Jail: s.jail, GatewayURL: env.GatewayURL}
	if bin := cmp.Or(s.binary, cfg.InternBinary); bin != "" {
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

// internJail is the jail of every local intern, after checking its
// settings. Its relays are open until the caller closes them.
func internJail(cfg config.Config, gw net.Addr, log *slog.Logger) (*JailConfig, *egress.Relay, error) {
	gwAddr := gw.String()
	if host, port, err := net.SplitHostPort(gwAddr); err == nil {
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			gwAddr = net.JoinHostPort("127.0.0.1", port)
		}
	}
	allow, err := safehttp.ParseAllowlist(cfg.InternEgressAllow)
	if err != nil {
		return nil, nil, fmt.Errorf("--intern-egress-allow-hosts: %w", err)
	}
	var toolCA []byte
	if cfg.HTTPToolCAFile != "" {
		if toolCA, err = os.ReadFile(cfg.HTTPToolCAFile); err != nil {
			return nil, nil, fmt.Errorf("--http-tool-ca-file: %w", err)
		}
	}
	traces, tracesHeaders := "", http.Header(nil)
	if telemetry.Enabled() {
		traces, tracesHeaders = telemetry.TracesEndpoint()
	}
	relay, err := egress.New(egress.Config{GatewayAddr: gwAddr, ModelBaseURL: cfg.AgentBaseURL, ModelAPIKey: cfg.AgentAPIKey,
		Placeholder: agents.KeyPlaceholder, Internet: true, Allow: allow, TracesURL: traces, TracesHeaders: tracesHeaders,
		UpstreamRoots: pemCerts(toolCA), Log: log.With("component", "egress")})
	if err != nil {
		return nil, nil, fmt.Errorf("model endpoint (COHORT_AGENT_BASE_URL): %w", err)
	}
	jc := &JailConfig{Relay: relay, AgentEnv: cfg.AgentEnv, ReadOnly: cfg.JailReadOnly, HTTPToolCA: string(toolCA), Traces: traces != "",
		Orphan: cfg.JailOrphanTimeout, Limits: Limits(cfg.InternLimits),
		Hide: HiddenPaths(append([]string{cfg.DataDir, cfg.KEKPath(), cfg.SQLitePath()}, BinaryDir()...)...)}
	if cfg.AgentAPIKey != "" {
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
