package provision

import (
	"context"
	"fmt"
	"hash/fnv"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/telemetry"
)

// Ports inside every jail, on its own loopback: where its relays listen.
const (
	PortModel    = 7101 // the model endpoint, the model key added on the way out
	PortGateway  = 7102 // the gateway's API (the vault, for http_request)
	PortInternet = 7103 // an HTTP proxy to public addresses
	PortTraces   = 7104 // the operator's trace collector (OTLP/HTTP), when tracing is on
)

// Relay kinds: the byte a jail sends with each connection (internal/egress).
const (
	KindGateway  byte = 'g'
	KindModel    byte = 'm'
	KindInternet byte = 'i'
	KindTraces   byte = 't'
)

// httpToolCAPath is where a jail holds the operator's http_request CA.
const httpToolCAPath = "/run/cohort/http-tool-ca.pem"

// InternDir is the intern's directory inside its jail.
const InternDir = "/intern"

// binPath is where the daemon's binary sits inside a jail.
const binPath = "/run/cohort/bin/cohort"

// Relay serves the gateway side of the jails' relays (*egress.Relay).
type Relay interface {
	// Serve handles one connection of the given kind and closes it.
	Serve(kind byte, c net.Conn)
	// InJailModelURL is the model base URL agents use inside a jail, given
	// the model relay's in-jail address.
	InJailModelURL(addr string) string
	// ServeModel handles one model connection of a jail with its own
	// endpoint, key(ctx) standing in for the placeholder.
	ServeModel(c net.Conn, baseURL string, key func(context.Context) (string, error))
}

// JailConfig makes the local provisioner run every daemon in its own
// jail: its own user, a mount view without the gateway's files, its own
// PIDs, and a network namespace whose only ways out are the relays.
type JailConfig struct {
	Relay Relay
	// ModelKeyPlaceholder is the model key agents see when the gateway has
	// one; the model relay puts the real key in its place.
	ModelKeyPlaceholder string
	// AgentEnv is passed to every daemon (and so to its agent): the
	// COHORT_AGENT_* settings without the endpoint and the key.
	AgentEnv []string
	// ReadOnly are extra host paths bound read-only at the same path (an
	// agent's runtime outside /usr, say).
	ReadOnly []string
	// Traces gives each jail a relay to the operator's trace collector and
	// points the daemon (and the built-in agent) at it.
	Traces bool
	// HTTPToolCA is PEM the daemon's http_request trusts besides the
	// system roots, put in the jail read-only.
	HTTPToolCA string
	// Hide are host paths that must stay absent even where a bind would
	// show them: the data directory, the KEK, the database, the binary's
	// directory.
	Hide []string
}

// Check refuses a read-only bind that a hidden path would cover: the
// operator asked for it, and a jail that silently lacks it would fail
// later with a confusing "no such file".
func (c JailConfig) Check() error {
	for _, ro := range c.ReadOnly {
		abs, err := filepath.Abs(ro)
		if err != nil {
			return err
		}
		for _, h := range c.Hide {
			if rel, err := filepath.Rel(h, abs); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
				return fmt.Errorf("--jail-ro-bind %s is inside %s, which jails never show (the gateway's data or binary directory): move it elsewhere", ro, h)
			}
		}
	}
	return nil
}

// jailUID is the dedicated host uid (and gid) of an intern's jail when the
// gateway runs as root: stable across restarts (its files stay its own) and
// different per intern (one intern's files are not another's), in a range
// no distribution allocates.
func jailUID(internID string) int {
	h := fnv.New32a()
	h.Write([]byte(internID))
	return 2_000_000_000 + int(h.Sum32()%100_000_000)
}

// DaemonJail describes the jail of one intern's daemon: the local
// provisioner's, and `cohort intern --jail`'s on a remote host.
type DaemonJail struct {
	InternID, Model string
	// HostDir is the intern's directory on the host, the jail's /intern.
	HostDir string
	// Self is the argv that runs `cohort` on the host; its binary is bound
	// into the jail on its own.
	Self []string
	// DaemonArgs are further `cohort intern` flags (agent command, bounds).
	DaemonArgs []string
	// Upstream, when set, is this jail's own model endpoint (a third-party
	// agent's provider): its model relay goes there, with UpstreamKey's
	// value in place of the placeholder, instead of the gateway's endpoint.
	Upstream    string
	UpstreamKey func(context.Context) (string, error)
	JailConfig
}

// Spec is the jail: system directories read-only, the binary, the
// intern's directory writable, an /etc/passwd naming its user, the relays.
func (o DaemonJail) Spec() jail.Spec {
	uid := jail.ProgramUID
	if os.Geteuid() == 0 {
		uid = jailUID(o.InternID)
	}
	args := []string{binPath}
	if len(o.Self) > 1 {
		args = append(args, o.Self[1:]...)
	}
	proxy := fmt.Sprintf("http://127.0.0.1:%d", PortInternet)
	args = append(args, "intern", "--listen-fd", "3", "--secret-fd", "4", "--data-dir", InternDir,
		"--intern-id", o.InternID, "--model", o.Model,
		"--gateway-url", fmt.Sprintf("http://127.0.0.1:%d/api/v1", PortGateway), "--http-tool-proxy", proxy)
	args = append(args, o.DaemonArgs...)
	files := []jail.File{}
	if o.HTTPToolCA != "" {
		files = append(files, jail.File{Dst: httpToolCAPath, Content: o.HTTPToolCA})
		args = append(args, "--http-tool-ca-file", httpToolCAPath)
	}
	env := []string{
		"PATH=/run/cohort/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + InternDir + "/home", "TMPDIR=/tmp", "LANG=C.UTF-8", "USER=intern", "LOGNAME=intern",
		"HTTP_PROXY=" + proxy, "HTTPS_PROXY=" + proxy, "http_proxy=" + proxy, "https_proxy=" + proxy,
		"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1",
		"COHORT_AGENT_BASE_URL=" + o.Relay.InJailModelURL(fmt.Sprintf("127.0.0.1:%d", PortModel)),
		// A third-party agent's endpoint, as it calls it: the same relay.
		"COHORT_AGENT_PROVIDER_URL=" + o.inJailUpstream(),
	}
	if o.ModelKeyPlaceholder != "" {
		env = append(env, "COHORT_AGENT_API_KEY="+o.ModelKeyPlaceholder)
	}
	relays := []jail.Relay{{Port: PortModel, Kind: KindModel}, {Port: PortGateway, Kind: KindGateway},
		{Port: PortInternet, Kind: KindInternet}}
	if o.Traces {
		env = append(env, telemetry.JailEnv(fmt.Sprintf("127.0.0.1:%d", PortTraces))...)
		relays = append(relays, jail.Relay{Port: PortTraces, Kind: KindTraces})
	}
	env = append(env, o.AgentEnv...)
	binds := append(jail.SystemBinds(), jail.Bind{Src: o.Self[0], Dst: binPath})
	for _, ro := range o.ReadOnly {
		binds = append(binds, jail.Bind{Src: ro, Dst: ro, Optional: true})
	}
	binds = append(binds, jail.Bind{Src: o.HostDir, Dst: InternDir, Writable: true})
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\nintern:x:%d:%d:intern:%s/home:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", uid, uid, InternDir)
	group := fmt.Sprintf("root:x:0:\nintern:x:%d:\nnogroup:x:65534:\n", uid)
	return jail.Spec{
		Argv: args, Env: env, Dir: InternDir, Binds: binds,
		Files:  append(files, jail.File{Dst: "/etc/passwd", Content: passwd}, jail.File{Dst: "/etc/group", Content: group}),
		Hide:   o.Hide,
		Relays: relays,
		UID:    uid, GID: uid, Hostname: "intern",
	}
}

// Start prepares the intern's directory and starts the jail. The daemon
// serves on listener (a socket opened outside, so its address is known
// before it starts and nothing inside the jail can reach the port) and
// reads secret from a pipe, never from its environment. Connections to the
// relays go to o.Relay until the jail ends.
func (o DaemonJail) Start(listener *os.File, secret string, stdout, stderr *os.File) (*jail.Jail, error) {
	spec := o.Spec()
	if err := os.MkdirAll(filepath.Join(o.HostDir, "home"), 0o700); err != nil {
		return nil, err
	}
	if err := ownDir(o.HostDir, spec.UID); err != nil {
		return nil, fmt.Errorf("give the intern's directory to its jail: %w", err)
	}
	sr, sw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer sr.Close()
	if _, err := sw.WriteString(secret); err != nil {
		sw.Close()
		return nil, err
	}
	sw.Close()
	j, err := jail.Start(spec, jail.Options{Stdout: stdout, Stderr: stderr, Files: []*os.File{listener, sr}})
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			kind, c, err := j.Accept()
			if err != nil {
				return
			}
			if kind == KindModel && o.Upstream != "" {
				go o.Relay.ServeModel(c, o.Upstream, o.UpstreamKey)
				continue
			}
			go o.Relay.Serve(kind, c)
		}
	}()
	return j, nil
}

// inJailUpstream is the model base URL a third-party agent calls in the
// jail: the model relay, with its endpoint's path.
func (o DaemonJail) inJailUpstream() string {
	if o.Upstream == "" {
		return o.Relay.InJailModelURL(fmt.Sprintf("127.0.0.1:%d", PortModel))
	}
	u, err := url.Parse(o.Upstream)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("http://127.0.0.1:%d%s", PortModel, strings.TrimRight(u.EscapedPath(), "/"))
}

// daemonJail is the provisioner's jail for an intern running the agent
// named agent.
func (p *Provisioner) daemonJail(id, model, agent, hostDir string, self []string) (DaemonJail, error) {
	run, err := p.agentFor(agent, true)
	if err != nil {
		return DaemonJail{}, err
	}
	o := DaemonJail{InternID: id, Model: model, HostDir: hostDir, Self: self, DaemonArgs: append(p.daemonFlags(), run.flags...), JailConfig: *p.Jail}
	if run.upstream != "" {
		o.Upstream, o.UpstreamKey = run.upstream, p.modelKey(id, run)
	}
	if run.modules != "" {
		o.ReadOnly = append(slices.Clone(o.ReadOnly), run.modules)
	}
	return o, nil
}

// ProbeJail checks that this machine can make the interns' jails; the
// error names what is missing and the remedy.
func (p *Provisioner) ProbeJail() error {
	self, err := p.selfCommand()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "cohort-jail-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dj, err := p.daemonJail("probe", "", "", dir, self)
	if err != nil {
		return err
	}
	spec := dj.Spec()
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, spec.UID, spec.GID); err != nil {
			return err
		}
	}
	if err := jail.Probe(spec); err != nil {
		return fmt.Errorf("this machine cannot jail interns: %w", err)
	}
	return nil
}

// selfCommand is the argv that runs `cohort` (Command, or this binary).
func (p *Provisioner) selfCommand() ([]string, error) {
	if len(p.Command) > 0 {
		return p.Command, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return []string{self}, nil
}

// ownDir gives the intern's directory to its jail's user (root gateway):
// only when its owner is not already that user, so a restart costs one
// stat.
func ownDir(dir string, uid int) error {
	if os.Geteuid() != 0 {
		return nil
	}
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if owner(st) == uid {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, uid)
	})
}

// startJailed starts the intern's daemon in its jail, on a listener of the
// gateway's own loopback.
func (s *supervisor) startJailed(dir, secret string, stdout, stderr *os.File) (daemonProc, string, error) {
	p := s.p
	self, err := p.selfCommand()
	if err != nil {
		return nil, "", err
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, "", err
	}
	defer ln.Close()
	lf, err := ln.File()
	if err != nil {
		return nil, "", err
	}
	defer lf.Close()
	dj, err := p.daemonJail(s.id, s.model, s.agent, dir, self)
	if err != nil {
		return nil, "", err
	}
	j, err := dj.Start(lf, secret, stdout, stderr)
	if err != nil {
		return nil, "", err
	}
	return jailProc{j}, "http://" + ln.Addr().String(), nil
}

// HiddenPaths lists what a jail must never show, for JailConfig.Hide.
func HiddenPaths(paths ...string) []string {
	var out []string
	for _, p := range paths {
		if p == "" {
			continue
		}
		if abs, err := filepath.Abs(p); err == nil {
			out = append(out, abs)
			if real, err := filepath.EvalSymlinks(abs); err == nil && real != abs {
				out = append(out, real)
			}
		}
	}
	return out
}
