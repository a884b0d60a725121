package gvisor

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/jail"
)

// A sandbox's bundle holds the jail's view: of the host only /intern is
// writable (beside the sandbox's own daemon socket directory), a hidden
// path a bind would show is covered, every limit is set, and the secret is
// in neither the command line nor the environment.
func TestBundleHoldsTheJailsView(t *testing.T) {
	host := t.TempDir()
	hidden := filepath.Join(host, "data")
	if err := os.MkdirAll(filepath.Join(hidden, "interns", "i1"), 0o700); err != nil {
		t.Fatal(err)
	}
	kek := filepath.Join(host, "kek.json")
	os.WriteFile(kek, []byte("{}"), 0o600)
	spec := jail.Spec{
		Argv: []string{"/run/cohort/bin/cohort", "intern", "--listen-fd", "3", "--secret-fd", "4"},
		Env:  []string{"PATH=/usr/bin"}, Dir: "/intern",
		Binds: []jail.Bind{{Src: "/usr", Dst: "/usr"}, {Src: host, Dst: "/opt/x"}, {Src: kek, Dst: "/etc/resolv.conf"},
			{Src: filepath.Join(hidden, "interns", "i1"), Dst: "/intern", Writable: true}},
		Files:  []jail.File{{Dst: "/etc/passwd", Content: "intern:x:2000:2000::/intern/home:/bin/sh\n"}},
		Hide:   []string{hidden, kek},
		Relays: []jail.Relay{{Port: 7101, Kind: 'm'}, {Port: 7102, Kind: 'g'}},
		UID:    2000, GID: 2000,
		Limits: jail.Limits{Memory: 256 << 20, Pids: 100, CPUWeight: 50, CPUs: 0.5, Tmpfs: 64 << 20, FileSize: 1 << 30},
	}
	sb := sandbox{dir: filepath.Join(t.TempDir(), "sb")}
	if err := os.MkdirAll(sb.files(), 0o700); err != nil {
		t.Fatal(err)
	}
	c, err := sb.config(spec, "/bin/true", "/cohort-gvisor/x")
	if err != nil {
		t.Fatal(err)
	}
	var writable, covered []string
	for _, m := range c.Mounts {
		if m.Type == "bind" && !slices.Contains(m.Options, "ro") {
			writable = append(writable, m.Destination)
		}
		if strings.HasPrefix(m.Destination, "/opt/x/") {
			covered = append(covered, m.Destination)
		}
	}
	slices.Sort(writable)
	if want := []string{"/intern", daemonDir}; !slices.Equal(writable, want) {
		t.Errorf("writable host binds %v, want %v", writable, want)
	}
	slices.Sort(covered)
	if want := []string{"/opt/x/data", "/opt/x/kek.json"}; !slices.Equal(covered, want) {
		t.Errorf("hidden paths covered %v, want %v", covered, want)
	}
	if !c.Root.Readonly || c.Process.User.UID != 2000 || !c.Process.NoNewPrivs || len(c.Process.Capabilities["bounding"]) != 0 {
		t.Errorf("root read-only %v, uid %d, no new privileges %v, capabilities %v", c.Root.Readonly, c.Process.User.UID, c.Process.NoNewPrivs, c.Process.Capabilities)
	}
	r := c.Linux.Resources
	if r == nil || r.Memory.Limit != 256<<20 || r.CPU.Shares != 512 || r.CPU.Quota != 50_000 || r.Pids.Limit != int64(hostThreadsPerProcess*100+sentryThreads) {
		t.Errorf("resources %+v", r)
	}
	rl := map[string]uint64{}
	for _, l := range c.Process.Rlimits {
		rl[l.Type] = l.Hard
	}
	if rl["RLIMIT_NPROC"] != 100 || rl["RLIMIT_FSIZE"] != 1<<30 {
		t.Errorf("rlimits %v", rl)
	}
	for _, m := range c.Mounts {
		if m.Destination == "/tmp" && !slices.Contains(m.Options, "size=67108864") {
			t.Errorf("/tmp options %v", m.Options)
		}
	}
	// The commands' view (ADR 0985): every bind again under it, read-only,
	// the hidden paths covered there too, a /tmp and /dev of its own, no
	// /proc.
	view := map[string]ociMount{}
	for _, m := range c.Mounts {
		if rel, ok := strings.CutPrefix(m.Destination, jail.CommandView); ok {
			view[rel] = m
		}
	}
	for _, d := range []string{"/usr", "/opt/x", "/intern", "/opt/x/data", "/opt/x/kek.json", "/etc/passwd"} {
		if m, ok := view[d]; !ok || !slices.Contains(m.Options, "ro") || slices.Contains(m.Options, "rw") {
			t.Errorf("the commands' view's %s: %+v (present %v)", d, m, ok)
		}
	}
	if view["/intern"].Source != filepath.Join(hidden, "interns", "i1") {
		t.Errorf("the commands' view's /intern is %q", view["/intern"].Source)
	}
	if view["/tmp"].Type != "tmpfs" || !slices.Contains(view["/tmp"].Options, "size=67108864") || view["/dev"].Type != "devtmpfs" {
		t.Errorf("the commands' view's /tmp %+v, /dev %+v", view["/tmp"], view["/dev"])
	}
	if _, ok := view["/etc/resolv.conf"]; ok {
		t.Errorf("the commands' view holds the network's /etc/resolv.conf: a confined command has no network")
	}
	if _, ok := view["/proc"]; ok || len(view) != 8 {
		t.Errorf("the commands' view holds %v", slices.Sorted(maps.Keys(view)))
	}
	// The init's only variable is its configuration: the daemon's argv
	// and environment, its socket and the relays' ports.
	if len(c.Process.Env) != 1 || !strings.HasPrefix(c.Process.Env[0], initEnv+"=") || !strings.Contains(c.Process.Env[0], `"port":7102`) {
		t.Errorf("init environment %v", c.Process.Env)
	}
}

// Where the jail's bundle holds every root, a sandbox's programs are told
// no certificate directory (Go would read /etc/ssl/certs file by file
// through the gofer, ADR 0984); without the bundle, or with a directory
// set, the environment is the jail's.
func TestCertDirOnlyWithTheBundle(t *testing.T) {
	with := []string{"PATH=/usr/bin", "SSL_CERT_FILE=/run/cohort/ca-bundle.pem"}
	if got := certDirEnv(with); !slices.Equal(got, append(slices.Clone(with), "SSL_CERT_DIR="+noCertDir)) {
		t.Errorf("with the bundle: %v", got)
	}
	if len(with) != 2 {
		t.Errorf("the jail's environment was changed: %v", with)
	}
	for _, env := range [][]string{{"PATH=/usr/bin"}, {"SSL_CERT_FILE=/b.pem", "SSL_CERT_DIR=/d"}} {
		if got := certDirEnv(env); !slices.Equal(got, env) {
			t.Errorf("%v became %v", env, got)
		}
	}
}
