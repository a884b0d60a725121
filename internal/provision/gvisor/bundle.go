package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/provision/localjail"
)

// An intern's sandbox is the jail localjail would make (jail.Spec, from
// localjail.DaemonJail), written as an OCI bundle for runsc: the same
// system directories read-only, the same files, /intern writable, the same
// relay ports on the sandbox's own loopback; what differs is the wall
// (gVisor's Sentry instead of the host kernel's namespaces) and that the
// sandbox's init (init.go) bridges the relays over host unix sockets
// (ADR 0981).

// Paths inside a sandbox.
const (
	initPath   = "/run/cohort/init"   // the gateway's binary: the sandbox's init
	relaysDir  = "/run/cohort/relays" // host sockets of the relays, one per kind
	daemonDir  = "/run/cohort/daemon" // the daemon's socket, made inside
	daemonSock = daemonDir + "/daemon.sock"
)

// ociSpec is what of the OCI runtime spec a sandbox uses.
type ociSpec struct {
	Version  string     `json:"ociVersion"`
	Process  ociProcess `json:"process"`
	Root     ociRoot    `json:"root"`
	Hostname string     `json:"hostname"`
	Mounts   []ociMount `json:"mounts"`
	Linux    ociLinux   `json:"linux"`
}

type ociProcess struct {
	User         ociUser          `json:"user"`
	Args         []string         `json:"args"`
	Env          []string         `json:"env"`
	Cwd          string           `json:"cwd"`
	Capabilities map[string][]any `json:"capabilities"`
	NoNewPrivs   bool             `json:"noNewPrivileges"`
	Rlimits      []ociRlimit      `json:"rlimits,omitempty"`
}

type ociUser struct {
	UID int `json:"uid"`
	GID int `json:"gid"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	CgroupsPath string         `json:"cgroupsPath,omitempty"`
	Resources   *ociResources  `json:"resources,omitempty"`
	Namespaces  []ociNamespace `json:"namespaces"`
}

type ociNamespace struct {
	Type string `json:"type"`
}

type ociResources struct {
	Memory *ociMemory `json:"memory,omitempty"`
	CPU    *ociCPU    `json:"cpu,omitempty"`
	Pids   *ociPids   `json:"pids,omitempty"`
}

type ociMemory struct {
	Limit int64 `json:"limit"`
	Swap  int64 `json:"swap"`
}

type ociCPU struct {
	Shares uint64 `json:"shares,omitempty"`
	Quota  int64  `json:"quota,omitempty"`
	Period uint64 `json:"period,omitempty"`
}

type ociPids struct {
	Limit int64 `json:"limit"`
}

// initConfig is what the sandbox's init is told (in its environment).
type initConfig struct {
	// Argv, Env and Dir are the daemon's (the jail's program).
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// Listen is the unix socket the daemon serves on (its fd 3).
	Listen string `json:"listen"`
	// Relays are the loopback ports the init listens on, each bridged to
	// the host socket of its kind.
	Relays []initRelay `json:"relays"`
}

type initRelay struct {
	Port int    `json:"port"`
	Sock string `json:"sock"`
}

// initEnv is the variable that makes the gateway's binary a sandbox's init.
const initEnv = "COHORT_GVISOR_INIT"

// relaySock is the socket of a relay kind, in relaysDir (dir: on the host).
func relaySock(dir string, kind byte) string {
	return filepath.Join(dir, string(rune(kind))+".sock")
}

// sandbox is one intern's sandbox on the host: <data>/gvisor/<id>.
type sandbox struct {
	dir string
}

func (s sandbox) bundle() string     { return filepath.Join(s.dir, "bundle") }
func (s sandbox) relays() string     { return filepath.Join(s.dir, "relays") }
func (s sandbox) daemon() string     { return filepath.Join(s.dir, "daemon") }
func (s sandbox) daemonSock() string { return filepath.Join(s.daemon(), "daemon.sock") }
func (s sandbox) files() string      { return filepath.Join(s.dir, "files") }

// write writes the bundle of spec, whose init is the host binary init and
// whose cgroup is cgroup: the directories, the files the jail holds, and
// config.json. The sandbox's own directories are root's; the daemon's is
// the sandbox user's (it makes its socket there).
func (s sandbox) write(spec jail.Spec, init, cgroup string) error {
	if err := os.RemoveAll(s.dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.dir), 0o700); err != nil {
		return err
	}
	for _, d := range []string{filepath.Join(s.bundle(), "rootfs"), s.relays(), s.daemon(), s.files()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return err
	}
	if err := os.Chown(s.daemon(), spec.UID, spec.GID); err != nil {
		return err
	}
	cfg, err := s.config(spec, init, cgroup)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(cfg, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.bundle(), "config.json"), b, 0o600)
}

// config is the OCI spec of the sandbox.
func (s sandbox) config(spec jail.Spec, init, cgroup string) (ociSpec, error) {
	ic := initConfig{Argv: spec.Argv, Env: certDirEnv(spec.Env), Dir: spec.Dir, Listen: daemonSock}
	for _, r := range spec.Relays {
		ic.Relays = append(ic.Relays, initRelay{Port: r.Port, Sock: relaySock(relaysDir, r.Kind)})
		if r.Kind == localjail.KindModel {
			// The built-in agent calls the model relay's host socket
			// itself, not through the init's bridge: a process and its
			// system calls fewer, each a ptrace round trip, on every
			// model call and chunk (ADR 0986).
			ic.Env = append(ic.Env[:len(ic.Env):len(ic.Env)], "COHORT_AGENT_MODEL_SOCKET="+relaySock(relaysDir, r.Kind))
		}
	}
	icb, err := json.Marshal(ic)
	if err != nil {
		return ociSpec{}, err
	}
	l := spec.Limits
	tmpfs := []string{"nosuid", "nodev", "mode=1777"}
	if l.Tmpfs > 0 {
		tmpfs = append(tmpfs, "size="+strconv.FormatInt(l.Tmpfs, 10))
	}
	mounts := []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: tmpfs},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "tmpfs", Options: tmpfs},
	}
	base := mounts
	for _, b := range spec.Binds {
		if _, err := os.Stat(b.Src); err != nil {
			if b.Optional {
				continue
			}
			return ociSpec{}, fmt.Errorf("the sandbox's %s: %w", b.Dst, err)
		}
		opt := []string{"rbind", "ro", "nosuid", "nodev"}
		if b.Writable {
			opt[1] = "rw"
		}
		mounts = append(mounts, ociMount{Destination: b.Dst, Type: "bind", Source: b.Src, Options: opt})
		// What a bind would show of a hidden path is covered.
		for _, h := range spec.Hide {
			if rel, err := filepath.Rel(b.Src, h); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && rel != "." {
				st, err := os.Stat(h)
				switch {
				case err != nil:
				case st.IsDir():
					mounts = append(mounts, ociMount{Destination: filepath.Join(b.Dst, rel), Type: "tmpfs", Source: "tmpfs", Options: []string{"ro", "size=0"}})
				default:
					empty := filepath.Join(s.files(), "empty")
					if err := os.WriteFile(empty, nil, 0o444); err != nil {
						return ociSpec{}, err
					}
					mounts = append(mounts, ociMount{Destination: filepath.Join(b.Dst, rel), Type: "bind", Source: empty, Options: []string{"bind", "ro"}})
				}
			}
		}
	}
	for i, f := range spec.Files {
		src := filepath.Join(s.files(), strconv.Itoa(i))
		if err := os.WriteFile(src, []byte(f.Content), 0o644); err != nil {
			return ociSpec{}, err
		}
		mounts = append(mounts, ociMount{Destination: f.Dst, Type: "bind", Source: src, Options: []string{"bind", "ro"}})
	}
	mounts = append(mounts, commandView(mounts[len(base):], tmpfs)...)
	mounts = append(mounts,
		ociMount{Destination: initPath, Type: "bind", Source: init, Options: []string{"bind", "ro"}},
		ociMount{Destination: relaysDir, Type: "bind", Source: s.relays(), Options: []string{"bind", "ro"}},
		ociMount{Destination: daemonDir, Type: "bind", Source: s.daemon(), Options: []string{"bind", "rw"}})
	// Every mount point exists in the root, readable by the sandbox's
	// user: those runsc would make are root's alone.
	for _, m := range mounts {
		if err := s.mountPoint(m); err != nil {
			return ociSpec{}, err
		}
	}
	proc := ociProcess{
		User: ociUser{UID: spec.UID, GID: spec.GID}, Args: []string{initPath},
		Env: []string{initEnv + "=" + string(icb)}, Cwd: "/",
		// No capability, in the sandbox either.
		Capabilities: map[string][]any{"bounding": {}, "effective": {}, "inheritable": {}, "permitted": {}, "ambient": {}},
		NoNewPrivs:   true,
		Rlimits:      []ociRlimit{{Type: "RLIMIT_NOFILE", Hard: 65536, Soft: 65536}},
	}
	if l.Pids > 0 {
		// The intern's processes and threads, counted by the Sentry (all
		// run as the sandbox's one user).
		proc.Rlimits = append(proc.Rlimits, ociRlimit{Type: "RLIMIT_NPROC", Hard: uint64(l.Pids), Soft: uint64(l.Pids)})
	}
	if l.FileSize > 0 {
		proc.Rlimits = append(proc.Rlimits, ociRlimit{Type: "RLIMIT_FSIZE", Hard: uint64(l.FileSize), Soft: uint64(l.FileSize)})
	}
	lx := ociLinux{CgroupsPath: cgroup, Namespaces: []ociNamespace{{"pid"}, {"network"}, {"ipc"}, {"uts"}, {"mount"}}}
	if res := resources(l); res != nil {
		lx.Resources = res
	}
	host := spec.Hostname
	if host == "" {
		host = "intern"
	}
	return ociSpec{Version: "1.0.0", Process: proc, Root: ociRoot{Path: "rootfs", Readonly: true}, Hostname: host,
		Mounts: mounts, Linux: lx}, nil
}

// commandView is the view a command allowed once runs in (jail.CommandView,
// ADR 0985): the jail's binds, hidden paths and files again under it, every
// one read-only (/intern included), a /tmp of its own and gVisor's /dev,
// and no /proc. The sandbox makes it because nothing inside can: gVisor's
// kernel of this release mounts nothing in a user namespace and remounts
// nothing read-only, so the command's jail enters it by chroot.
func commandView(binds []ociMount, tmpfs []string) []ociMount {
	view := []ociMount{
		{Destination: jail.CommandView + "/dev", Type: "devtmpfs", Source: "devtmpfs"},
		{Destination: jail.CommandView + "/tmp", Type: "tmpfs", Source: "tmpfs", Options: tmpfs},
	}
	for _, m := range binds {
		if networkOnly[m.Destination] || strings.HasPrefix(m.Destination, "/etc/ssl/") {
			continue
		}
		m.Destination = jail.CommandView + m.Destination
		m.Options = slices.Clone(m.Options)
		for i, o := range m.Options {
			if o == "rw" {
				m.Options[i] = "ro"
			}
		}
		if !slices.Contains(m.Options, "ro") {
			m.Options = append(m.Options, "ro")
		}
		view = append(view, m)
	}
	return view
}

// networkOnly are the jail's /etc entries that serve only the network,
// which a confined command has none of: left out of the commands' view,
// since each bind costs the sandbox's start a gofer mount (ADR 0985).
var networkOnly = map[string]bool{
	"/etc/resolv.conf": true, "/etc/hosts": true, "/etc/host.conf": true, "/etc/gai.conf": true,
	"/etc/services": true, "/etc/protocols": true, "/etc/ssl": true, "/etc/ca-certificates": true,
	"/etc/ca-certificates.conf": true, "/run/cohort/ca-bundle.pem": true,
}

// noCertDir is the sandbox's SSL_CERT_DIR: no directory.
const noCertDir = "/run/cohort/no-cert-dir"

// certDirEnv is env with SSL_CERT_DIR set to no directory where
// SSL_CERT_FILE names the jail's bundle (every system root and the
// gateway's CA). Go's crypto/x509 reads that file and then every file of
// /etc/ssl/certs besides, ~290 links and files: under gVisor each is a
// round trip to the gofer, and the daemon's start spent 300 ms of a wake
// there (ADR 0984). OpenSSL takes the same variable and finds its roots in
// the file.
func certDirEnv(env []string) []string {
	file, dir := false, false
	for _, e := range env {
		file = file || strings.HasPrefix(e, "SSL_CERT_FILE=")
		dir = dir || strings.HasPrefix(e, "SSL_CERT_DIR=")
	}
	if !file || dir {
		return env
	}
	return append(env[:len(env):len(env)], "SSL_CERT_DIR="+noCertDir)
}

// Host threads of a sandbox: measured on the ptrace platform, 200 idle
// guest processes took 1268 and 400 sleeps 4023 (ADR 0984), and the
// Sentry's own.
const (
	hostThreadsPerProcess = 12
	sentryThreads         = 256
)

// resources are the sandbox cgroup's limits: the Sentry, its netstack
// (socket buffers included) and the gofer count against them, beside the
// intern's programs.
func resources(l jail.Limits) *ociResources {
	var r ociResources
	if l.Memory > 0 {
		r.Memory = &ociMemory{Limit: l.Memory, Swap: l.Memory}
	}
	if l.Pids > 0 {
		// The cgroup counts the Sentry's host threads, not the intern's
		// processes (RLIMIT_NPROC bounds those, by ending the sandbox:
		// ADR 0984): on the ptrace platform up to ten a process, and the
		// Sentry dies when it cannot make one. A backstop above what the
		// intern's bound needs.
		r.Pids = &ociPids{Limit: int64(hostThreadsPerProcess*l.Pids + sentryThreads)}
	}
	if l.CPUWeight > 0 || l.CPUs > 0 {
		r.CPU = &ociCPU{}
		if l.CPUWeight > 0 {
			r.CPU.Shares = uint64(l.CPUWeight) * 1024 / 100
		}
		if l.CPUs > 0 {
			r.CPU.Period = 100_000
			r.CPU.Quota = int64(l.CPUs * 100_000)
		}
	}
	if r.Memory == nil && r.Pids == nil && r.CPU == nil {
		return nil
	}
	return &r
}

// mountPoint makes m's destination in the bundle's root: a file for a bind
// of a file, else a directory, and the directories above it, 0755.
func (s sandbox) mountPoint(m ociMount) error {
	dst := filepath.Join(s.bundle(), "rootfs", m.Destination)
	file := false
	if m.Type == "bind" {
		if st, err := os.Stat(m.Source); err == nil && !st.IsDir() {
			file = true
		}
	}
	dir := dst
	if file {
		dir = filepath.Dir(dst)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if file {
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		f.Close()
	}
	return nil
}
