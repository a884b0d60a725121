package localjail

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/provision"
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

// CABundlePath is where a jail holds the system roots and the gateway's
// proxy CA (ADR 0931).
const CABundlePath = "/run/cohort/ca-bundle.pem"

// systemBundles are where distributions keep the system roots, as one file.
var systemBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// CABundle is the host's system roots followed by the proxy CA: a program
// pointed at it trusts the public hosts as before, and the gateway where it
// stands in for a host with a bound secret.
func CABundle(proxyCA string) string {
	b, _ := systemBundle()
	return b + proxyCA
}

// systemBundle is the host's system roots, newline-terminated, and the
// path of the regular file they are in ("" when none is).
func systemBundle() (string, string) {
	for _, p := range systemBundles {
		if b, err := os.ReadFile(p); err == nil {
			s := string(b)
			if !strings.HasSuffix(s, "\n") {
				s += "\n"
			}
			if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
				p = ""
			}
			return s, p
		}
	}
	return "", ""
}

// CABundleEnv points the variables programs read a CA bundle from (Go,
// OpenSSL, curl, git, Python requests, Node, npm, whose own fetch does not
// take Node's extra certificates) at path.
func CABundleEnv(path string) []string {
	return []string{"SSL_CERT_FILE=" + path, "CURL_CA_BUNDLE=" + path, "GIT_SSL_CAINFO=" + path,
		"REQUESTS_CA_BUNDLE=" + path, "NODE_EXTRA_CA_CERTS=" + path, "NPM_CONFIG_CAFILE=" + path}
}

// InternDir is the intern's directory inside its jail.
const InternDir = "/intern"

// binPath is where the daemon's binary sits inside a jail.
const binPath = "/run/cohort/bin/cohort"

// Relay serves the gateway side of the jails' relays (*egress.Relay).
type Relay interface {
	// Serve handles one connection of the given kind from intern's jail
	// and closes it; past the intern's cap on open relay connections it
	// closes it at once.
	Serve(intern string, kind byte, c net.Conn)
	// InJailModelURL is the model base URL agents use inside a jail, given
	// the model relay's in-jail address.
	InJailModelURL(addr string) string
	// ServeModel handles one model connection of intern's jail with its
	// own endpoint, key(ctx) standing in for the placeholder; the same cap
	// holds.
	ServeModel(intern string, c net.Conn, baseURL string, key func(context.Context) (string, error))
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
	// ProxyCA is the gateway's proxy CA certificate (PEM), when the
	// internet relay intercepts hosts with bound secrets (ADR 0931): the
	// jail gets a bundle of the system roots and it, and every variable
	// programs read a bundle from points at it.
	ProxyCA string
	// Hide are host paths that must stay absent even where a bind would
	// show them: the data directory, the KEK, the database, the binary's
	// directory.
	Hide []string
	// NoSeccomp leaves the daemon's jail without its syscall filter
	// (jail.SeccompOff): for measuring what the filter costs. Agents and
	// commands still get theirs.
	NoSeccomp bool
	// Orphan is how long the local provisioner's jails run on without a
	// gateway: a gateway that starts within it adopts them, their runs
	// (paused ones included) intact. 0 stops them with their gateway.
	Orphan time.Duration
	// Limits bound each jail (memory, processes, CPU share, tmpfs, file
	// size); LimitWarnings says which this host cannot enforce.
	Limits jail.Limits
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
		if err := WorldReadable(abs); err != nil {
			return fmt.Errorf("--jail-ro-bind %s: %w", ro, err)
		}
	}
	return nil
}

// WorldReadable refuses a tree a jail would show that holds something only
// its owner or group may read (a directory every user cannot list and
// enter, a file every user cannot read): a jail shows nothing of the kind,
// and an operator's bind is no exception. A missing path is no error (the
// bind is optional).
func WorldReadable(root string) error {
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		need := fs.FileMode(0o004)
		if info.IsDir() {
			need = 0o005
		}
		if info.Mode().Perm()&need != need {
			return fmt.Errorf("%s (mode %v) is not readable by every user, and a jail shows only what is: make it so, or bind another path", path, info.Mode().Perm())
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
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
	// Daemon is the daemon's launch, its intern's id and model; Spec sets
	// where it listens, its directory and its gateway (the relays').
	Daemon launch.Daemon
	// HostDir is the intern's directory on the host, the jail's /intern.
	HostDir string
	// Self is the argv that runs `cohort intern` on the host (cohort or
	// cohort-intern); its binary is bound into the jail on its own and is
	// the jail's init (this process's own: /proc/self/exe).
	Self []string
	// Upstream, when set, is this jail's own model endpoint (a third-party
	// agent's provider): its model relay goes there, with UpstreamKey's
	// value in place of the placeholder, instead of the gateway's endpoint.
	Upstream    string
	UpstreamKey func(context.Context) (string, error)
	// Control, when set, is the host path of the jail's control socket:
	// the jail outlives its gateway for Orphan, and the next one adopts it
	// (Attach).
	Control string
	JailConfig
}

// Spec is the jail: system directories read-only, the binary, the
// intern's directory writable, an /etc/passwd naming its user, the relays.
func (o DaemonJail) Spec() jail.Spec {
	uid := jail.ProgramUID
	if os.Geteuid() == 0 {
		uid = jailUID(o.Daemon.InternID)
	}
	args := []string{binPath}
	if len(o.Self) > 1 {
		args = append(args, o.Self[1:]...)
	}
	proxy := fmt.Sprintf("http://127.0.0.1:%d", PortInternet)
	d := o.Daemon
	d.Listen, d.ListenFD, d.SecretFD, d.DataDir = "", 3, 4, InternDir
	d.GatewayURL, d.HTTPToolProxy = fmt.Sprintf("http://127.0.0.1:%d/api/v1", PortGateway), proxy
	files := []jail.File{}
	if o.HTTPToolCA != "" {
		files = append(files, jail.File{Dst: httpToolCAPath, Content: o.HTTPToolCA})
		d.HTTPToolCAFile = httpToolCAPath
	}
	args = append(append(args, "intern"), d.Args()...)
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
	if o.ProxyCA != "" {
		bundle := CABundle(o.ProxyCA)
		files = append(files, jail.File{Dst: CABundlePath, Content: bundle})
		env = append(env, CABundleEnv(CABundlePath)...)
		// The jail's copy of the system bundle too, for programs that
		// read no variable (OpenSSL's default, Rust's native roots).
		if _, sys := systemBundle(); sys != "" {
			files = append(files, jail.File{Dst: sys, Content: bundle})
		}
	}
	env = append(env, o.AgentEnv...)
	binds := append(jail.SystemBinds(), jail.Bind{Src: o.Self[0], Dst: binPath})
	for _, ro := range o.ReadOnly {
		binds = append(binds, jail.Bind{Src: ro, Dst: ro, Optional: true})
	}
	binds = append(binds, jail.Bind{Src: o.HostDir, Dst: InternDir, Writable: true})
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\nintern:x:%d:%d:intern:%s/home:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", uid, uid, InternDir)
	group := fmt.Sprintf("root:x:0:\nintern:x:%d:\nnogroup:x:65534:\n", uid)
	spec := jail.Spec{
		Argv: args, Env: env, Dir: InternDir, Binds: binds,
		Files:  append(files, jail.File{Dst: "/etc/passwd", Content: passwd}, jail.File{Dst: "/etc/group", Content: group}),
		Hide:   o.Hide,
		Relays: relays,
		UID:    uid, GID: uid, Hostname: "intern",
		Limits: o.Limits,
		// The built-in agent runs manual-mode commands in jails of its
		// own; the daemon and it put the strict filter on every other
		// agent and command (ADR 0019).
		Seccomp: jail.SeccompNested,
	}
	if self, err := os.Executable(); err != nil || o.Self[0] != self {
		// Another binary (cohort-intern) is the init too; this one's
		// init stays /proc/self/exe, whatever has become of its path.
		spec.Init = o.Self[0]
	}
	if o.NoSeccomp {
		spec.Seccomp = jail.SeccompOff
	}
	if os.Geteuid() != 0 {
		// A gateway that is not root runs each intern as its own id of the
		// gateway user's subordinate range, never as that user.
		spec.SubID = jailUID(o.Daemon.InternID)
	}
	if o.Control != "" {
		spec.Control, spec.Orphan, spec.Tag = o.Control, o.Orphan, jailTag(spec)
	}
	return spec
}

// jailTag names what a jail runs: a gateway adopts a jail only if it would
// start the same one now. The binary's host path and the hidden paths are
// left out: `go run` builds to a new directory each time, and an upgraded
// binary at the same path leaves the adopted daemon on the old one until
// it next starts, which is what an upgrade should do to a running intern.
func jailTag(spec jail.Spec) string {
	spec.Hide = nil
	spec.Binds = slices.Clone(spec.Binds)
	for i, b := range spec.Binds {
		if b.Dst == binPath {
			spec.Binds[i].Src = ""
		}
	}
	b, _ := json.Marshal(spec)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// Start prepares the intern's directory and starts the jail. The daemon
// serves on listener (a socket opened outside, so its address is known
// before it starts and nothing inside the jail can reach the port) and
// reads secret from a pipe, never from its environment. Connections to the
// relays go to o.Relay until the jail ends (or, with Control, until this
// process lets go of it). output receives the daemon's output of a Control
// jail (stdout and stderr otherwise).
func (o DaemonJail) Start(listener *os.File, secret string, stdout, stderr *os.File, output io.Writer) (*jail.Jail, error) {
	spec := o.Spec()
	if err := ownDir(o.HostDir, spec); err != nil {
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
	if o.Control != "" {
		if err := os.MkdirAll(filepath.Dir(o.Control), 0o700); err != nil {
			return nil, err
		}
	}
	j, err := jail.Start(spec, jail.Options{Stdout: stdout, Stderr: stderr, Files: []*os.File{listener, sr}, Output: output})
	if err != nil {
		return nil, err
	}
	go o.serveRelays(j)
	return j, nil
}

// errNotThisJail is Attach's answer for a jail that runs something else
// than this gateway would start now (another model, agent or setting).
var errNotThisJail = errors.New("the jail runs another configuration")

// Attach adopts the jail at o.Control that a previous gateway started:
// its relays come here, its output to output. A jail that is not the one
// o describes is returned with errNotThisJail (the caller stops it).
func (o DaemonJail) Attach(output io.Writer) (*jail.Jail, error) {
	j, err := jail.Attach(o.Control, output)
	if err != nil {
		return nil, err
	}
	if j.Tag() != o.Spec().Tag {
		return j, errNotThisJail
	}
	// This gateway's setting holds from now on.
	if err := j.SetOrphan(o.Orphan); err != nil {
		return j, err
	}
	go o.serveRelays(j)
	return j, nil
}

// serveRelays serves the jail's relay connections while it is attached,
// each counted against the intern's cap by the relay.
func (o DaemonJail) serveRelays(j *jail.Jail) {
	serveRelays(o.Daemon.InternID, o.Relay, o.Upstream, o.UpstreamKey, j.Accept)
}

// serveRelays serves each connection accept yields until it fails.
func serveRelays(intern string, r Relay, upstream string, key func(context.Context) (string, error), accept func() (byte, net.Conn, error)) {
	for {
		kind, c, err := accept()
		if err != nil {
			return
		}
		if kind == KindModel && upstream != "" {
			go r.ServeModel(intern, c, upstream, key)
			continue
		}
		go r.Serve(intern, kind, c)
	}
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

// daemonJail is the backend's jail for an intern running the agent
// named agent, within the operator's limits and its own.
func (b *Backend) daemonJail(id, model, agent string, own config.InternLimits, hostDir string, self []string) (DaemonJail, error) {
	run, err := b.Agents.For(agent, true)
	if err != nil {
		return DaemonJail{}, err
	}
	o := DaemonJail{Daemon: b.daemon(id, model, run), HostDir: hostDir, Self: self,
		Control: b.controlPath(id), JailConfig: *b.Jail}
	// In the jail's Spec, so in its tag: a jail of other limits is not
	// adopted but replaced.
	o.Limits = internLimits(b.Jail.Limits, own)
	if run.Upstream != "" {
		o.Upstream, o.UpstreamKey = run.Upstream, b.Agents.ModelKeyFor(id, run)
	}
	if m := run.Launch.Modules; m != "" {
		o.ReadOnly = append(slices.Clone(o.ReadOnly), m)
	}
	return o, nil
}

// ProbeJail checks that this machine can make the interns' jails; the
// error names what is missing and the remedy.
func (b *Backend) ProbeJail() error {
	self, err := b.selfCommand()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "cohort-jail-probe-")
	if err != nil {
		return err
	}
	defer jail.RemoveAll(dir) // and its overlay's work directory
	dj, err := b.daemonJail("probe", "", "", config.InternLimits{}, dir, self)
	if err != nil {
		return err
	}
	dj.Control = ""
	if m := b.Agents.Catalog.Modules; m != "" {
		if err := WorldReadable(m); err != nil {
			return fmt.Errorf("the agents' modules: %w", err)
		}
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
func (b *Backend) selfCommand() ([]string, error) {
	if len(b.Command) > 0 {
		return b.Command, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return []string{self}, nil
}

// ownDir gives the intern's directory (with a home in it) to its jail's
// user: a dedicated uid (root gateway) or an id of the gateway user's
// subordinate range (jail.HostIDs); only when its owner is not already
// that user, so a restart costs one stat. (Once given, a gateway that is
// not root can no longer enter it: jail.RemoveAll removes it.)
func ownDir(dir string, spec jail.Spec) error {
	uid, gid, err := jail.HostIDs(spec)
	if err != nil {
		return err
	}
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if owner(st) == uid {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(dir, "home"), 0o700); err != nil {
		return err
	}
	if uid == os.Geteuid() {
		return nil
	}
	return jail.Chown(dir, uid, gid)
}

// startJailed starts the intern's daemon in its jail, on a listener of the
// gateway's own loopback, with secret.
func (b *Backend) startJailed(spec provision.Spec, dir, secret string, logs *os.File) (daemonProc, string, error) {
	self, err := b.selfCommand()
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
	dj, err := b.daemonJail(spec.ID, spec.Model, spec.Agent, spec.Limits, dir, self)
	if err != nil {
		return nil, "", err
	}
	j, err := dj.Start(lf, secret, nil, logs, logs)
	if err != nil {
		return nil, "", err
	}
	return jailProc{j}, "http://" + ln.Addr().String(), nil
}

// controlPath is where the intern's jail listens for its gateway: in the
// data directory, which no jail sees.
func (b *Backend) controlPath(id string) string {
	dir := filepath.Join(b.DataDir, "jails")
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return filepath.Join(dir, id+".sock")
}

// adopt takes over the intern's jail a previous gateway left running if
// it runs spec and answers at the row's URL with the row's secret;
// otherwise it stops that jail and returns no process (start a new one).
func (b *Backend) adopt(ctx context.Context, spec provision.Spec, dir string, logs *os.File) (daemonProc, error) {
	self, err := b.selfCommand()
	if err != nil {
		return nil, err
	}
	dj, err := b.daemonJail(spec.ID, spec.Model, spec.Agent, spec.Limits, dir, self)
	if err != nil {
		return nil, err
	}
	j, err := dj.Attach(logs)
	if j == nil {
		return nil, nil // it ended meanwhile
	}
	stop := func(why string, err error) (daemonProc, error) {
		b.log.Info("intern's jail from a previous gateway stopped", "intern", spec.ID, "why", why, "err", err)
		j.Kill()
		<-j.Done()
		return nil, nil
	}
	if err != nil {
		return stop("another configuration", err)
	}
	if spec.URL == "" || spec.Secret == "" {
		return stop("its row names no local daemon", nil)
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = b.check(hctx, spec.URL, spec.Secret)
	cancel()
	if err != nil {
		return stop("its daemon does not answer with the row's secret", err)
	}
	b.log.Info("intern's jail adopted from a previous gateway", "intern", spec.ID, "pid", j.Pid())
	return jailProc{j}, nil
}

// aliveJails lists the interns whose jails listen in the data directory,
// removing the sockets nobody listens on.
func (b *Backend) aliveJails() []string {
	dir := filepath.Dir(b.controlPath("x"))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var ids []string
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".sock")
		if !ok {
			continue
		}
		if !jail.Alive(filepath.Join(dir, e.Name())) {
			os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		ids = append(ids, id)
	}
	return ids
}

// stopJails ends the interns' jails a previous gateway left (at once, in
// parallel), waiting for each at most 5 s.
func (b *Backend) stopJails(ids []string, why string) {
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := jail.Attach(b.controlPath(id), nil)
			if err != nil {
				return
			}
			b.log.Info("intern's jail from a previous gateway stopped", "intern", id, "why", why)
			j.Kill()
			select {
			case <-j.Done():
			case <-time.After(5 * time.Second):
			}
		}()
	}
	wg.Wait()
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
