package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/interncmd"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/telemetry"
	"github.com/cohort-dev/cohort/internal/vault"
)

// modelKeyPlaceholder is the model key agents hold inside a jail; the
// model relay puts the real one in its place on the way out.
const modelKeyPlaceholder = provision.KeyPlaceholder

// internJail is the jail of every local intern, after checking its
// settings (server.New probes that this machine can make it: it fails
// closed, naming what is missing). Its relays are open until the
// returned function closes them.
func internJail(cfg config.Config, gw net.Addr, log *slog.Logger) (*localjail.JailConfig, *egress.Relay, func(), error) {
	gwAddr := gw.String()
	if host, port, err := net.SplitHostPort(gwAddr); err == nil {
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			gwAddr = net.JoinHostPort("127.0.0.1", port)
		}
	}
	allow, err := safehttp.ParseAllowlist(cfg.InternEgressAllow)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--intern-egress-allow-hosts: %w", err)
	}
	var toolCA []byte
	if cfg.HTTPToolCAFile != "" {
		if toolCA, err = os.ReadFile(cfg.HTTPToolCAFile); err != nil {
			return nil, nil, nil, fmt.Errorf("--http-tool-ca-file: %w", err)
		}
	}
	traces, tracesHeaders := "", http.Header(nil)
	if telemetry.Enabled() {
		traces, tracesHeaders = telemetry.TracesEndpoint()
	}
	relay, err := egress.New(egress.Config{GatewayAddr: gwAddr, ModelBaseURL: cfg.AgentBaseURL, ModelAPIKey: cfg.AgentAPIKey,
		Placeholder: modelKeyPlaceholder, Internet: true, Allow: allow, TracesURL: traces, TracesHeaders: tracesHeaders,
		UpstreamRoots: pemCerts(toolCA), Log: log.With("component", "egress")})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("model endpoint (COHORT_AGENT_BASE_URL): %w", err)
	}
	jc := &localjail.JailConfig{Relay: relay, AgentEnv: cfg.AgentEnv, ReadOnly: cfg.JailReadOnly, HTTPToolCA: string(toolCA), Traces: traces != "",
		Orphan: cfg.JailOrphanTimeout, Limits: jailLimits(cfg.InternLimits),
		Hide: localjail.HiddenPaths(append([]string{cfg.DataDir, kekPath(cfg), sqlitePath(cfg)}, binaryDir()...)...)}
	if cfg.AgentAPIKey != "" {
		jc.ModelKeyPlaceholder = modelKeyPlaceholder
	}
	if err := jc.Check(); err != nil {
		relay.Close()
		return nil, nil, nil, err
	}
	return jc, relay, func() { relay.Close() }, nil
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

// jailAgentEnv is what of the gateway's environment reaches a jailed
// daemon and its agent: the built-in agent's settings, without the model
// endpoint and key, which the relay stands in for.
func jailAgentEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "COHORT_AGENT_") && name != "COHORT_AGENT_BASE_URL" && name != "COHORT_AGENT_API_KEY" {
			out = append(out, kv)
		}
	}
	return out
}

// sqlitePath is the embedded database's file, when it is not in the data
// directory.
func sqlitePath(cfg config.Config) string {
	if p, ok := strings.CutPrefix(cfg.DatabaseURL, "sqlite:"); ok {
		return p
	}
	return ""
}

// binaryDir is the directory of this binary, unless it is a system one
// (/usr/local/bin…) whose other programs interns may need: the binary
// itself is bound into each jail on its own.
func binaryDir() []string {
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

// runJailedDaemon is `cohort intern --jail`: this process stays outside,
// holds the listener, the secret and the relays, and runs the daemon (and
// its agent) in a jail made like the local provisioner's.
func runJailedDaemon(ctx context.Context, o interncmd.Jailed, stdout, stderr io.Writer, log *slog.Logger) error {
	dir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	gwAddr := ""
	if o.GatewayURL != "" {
		u, err := url.Parse(o.GatewayURL)
		if err != nil || u.Host == "" || u.Scheme != "http" {
			// The jail reaches the gateway through a plain relay: https
			// would need the gateway's name inside, which it has not.
			return fmt.Errorf("--gateway-url with --jail must be http://host:port/…, not %q", o.GatewayURL)
		}
		gwAddr = u.Host
		if u.Port() == "" {
			gwAddr = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	key := env("COHORT_AGENT_API_KEY", os.Getenv("OPENAI_API_KEY"))
	relay, err := egress.New(egress.Config{GatewayAddr: gwAddr, ModelBaseURL: env("COHORT_AGENT_BASE_URL", os.Getenv("OPENAI_BASE_URL")),
		ModelAPIKey: key, Placeholder: modelKeyPlaceholder, Internet: true, Log: log.With("component", "egress")})
	if err != nil {
		return fmt.Errorf("model endpoint (COHORT_AGENT_BASE_URL): %w", err)
	}
	defer relay.Close()
	jc := localjail.JailConfig{Relay: relay, AgentEnv: jailAgentEnv(os.Environ()), ReadOnly: o.ReadOnly,
		Hide: localjail.HiddenPaths(append(o.Hide, binaryDir()...)...), Limits: jailLimits(o.Limits)}
	if o.GatewayURL != "" {
		// The vault's proxy door (ADR 0931): this process's own CA, in its
		// memory only; the gateway decides and releases.
		ca, err := vault.NewEphemeralProxyCA()
		if err != nil {
			return err
		}
		jc.ProxyCA = ca.CertPEM()
		gw := cohortv1connect.NewInternGatewayServiceClient(&http.Client{Timeout: 30 * time.Second, Transport: bearer{internd.DaemonCredential(o.Secret)}},
			strings.TrimSuffix(o.GatewayURL, "/"))
		relay.SetSecrets(vault.RemoteProxyDoor{Gateway: gw, InternID: o.InternID, CA: ca})
	}
	if key != "" {
		jc.ModelKeyPlaceholder = modelKeyPlaceholder
	}
	if err := jc.Check(); err != nil {
		return err
	}
	dj := localjail.DaemonJail{InternID: o.InternID, Model: o.Model, HostDir: dir, Self: []string{self}, DaemonArgs: o.Args, JailConfig: jc}
	if err := jail.Probe(dj.Spec()); err != nil {
		return fmt.Errorf("this machine cannot make the jail: %w", err)
	}
	for _, w := range localjail.LimitWarnings(jc.Limits) {
		log.Warn("a limit of the jail is not enforced on this host", "limit", w)
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return err
	}
	lf, err := ln.(*net.TCPListener).File()
	ln.Close()
	if err != nil {
		return err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return err
	}
	j, err := dj.Start(lf, o.Secret, outW, stderrFile(stderr), nil)
	lf.Close()
	outW.Close()
	if err != nil {
		outR.Close()
		return err
	}
	// The jailed daemon prints its address (this listener's) first.
	go func() {
		io.Copy(stdout, outR)
		outR.Close()
	}()
	select {
	case <-j.Done():
	case <-ctx.Done():
		j.Process.Signal(syscall.SIGTERM)
		select {
		case <-j.Done():
		case <-time.After(5 * time.Second):
			j.Process.Kill()
		}
	}
	st, _ := j.Wait()
	if ctx.Err() == nil && st != nil && !st.Success() {
		return fmt.Errorf("the jailed daemon exited: %v", st)
	}
	return nil
}

// bearer presents the daemon's credential to the gateway.
type bearer struct{ credential string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.credential)
	return http.DefaultTransport.RoundTrip(r)
}

// stderrFile is w when it is a file (the process's stderr); otherwise a
// pipe copied to w.
func stderrFile(w io.Writer) *os.File {
	if f, ok := w.(*os.File); ok {
		return f
	}
	r, pw, err := os.Pipe()
	if err != nil {
		return nil
	}
	go func() {
		io.Copy(w, r)
		r.Close()
	}()
	return pw
}
