package main

import (
	"context"
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
	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/interncmd"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
	"github.com/cohort-dev/cohort/internal/vault"
)

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
	baseURL, key := agentEndpoint()
	relay, err := egress.New(egress.Config{GatewayAddr: gwAddr, ModelBaseURL: baseURL,
		ModelAPIKey: key, Placeholder: agents.KeyPlaceholder, Internet: true, Log: log.With("component", "egress")})
	if err != nil {
		return fmt.Errorf("model endpoint (COHORT_AGENT_BASE_URL): %w", err)
	}
	defer relay.Close()
	jc := localjail.JailConfig{Relay: relay, AgentEnv: config.AgentEnv(os.Environ()), ReadOnly: o.ReadOnly,
		Hide: localjail.HiddenPaths(append(o.Hide, localjail.BinaryDir()...)...), Limits: localjail.Limits(o.Limits)}
	if o.GatewayURL != "" {
		// The vault's proxy door (ADR 0931): this process's own CA, in its
		// memory only; the gateway decides and releases.
		ca, err := vault.NewEphemeralProxyCA()
		if err != nil {
			return err
		}
		jc.ProxyCA = ca.CertPEM()
		gw := cohortv1connect.NewInternGatewayServiceClient(&http.Client{Timeout: 30 * time.Second, Transport: bearer{launch.DaemonCredential(o.Secret)}},
			strings.TrimSuffix(o.GatewayURL, "/"))
		relay.SetSecrets(vault.RemoteProxyDoor{Gateway: gw, InternID: o.Daemon.InternID, CA: ca})
	}
	if key != "" {
		jc.ModelKeyPlaceholder = agents.KeyPlaceholder
	}
	if err := jc.Check(); err != nil {
		return err
	}
	dj := localjail.DaemonJail{Daemon: o.Daemon, HostDir: dir, Self: []string{self}, JailConfig: jc}
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
