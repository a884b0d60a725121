package e2e_test

import (
	"os"
	"strings"
	"testing"
)

// procProbe goes after every Cohort process the command can see (the
// jail's init, the daemon, the built-in agent, a sandbox's init), whatever
// its user: none may be opened through /proc for reading or writing its
// memory, nor have its descriptors or directories followed. The third round of attacks
// wrote an execve into the built-in agent's memory this way (same uid,
// dumpable) and got its looser syscall filter: `unshare -Urm`. A success
// prints a marker the script's text does not hold; "saw-target" proves the
// probe found one.
const procProbe = `import os
me = {os.getpid(), os.getppid()}
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) in me:
        continue
    try:
        argv0 = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")[0]
    except OSError:
        continue
    name = os.path.basename(argv0).decode()
    if not name.startswith("cohort"):
        continue
    print("saw-" + "target", name, p)
    for tag, mode in ((1, os.O_RDONLY), (2, os.O_RDWR)):
        try:
            os.close(os.open("/proc/%s/mem" % p, mode))
            print("reached-%d" % (3000 + tag), name, p)
        except OSError as e:
            print("refused", name, p, e.strerror)
    for link in ["cwd", "root"] + ["fd/" + f for f in ("0", "1", "2", "3", "4")]:
        try:
            os.readlink("/proc/%s/%s" % (p, link))
            print("reached-%d" % 3004, name, p, link)
        except OSError:
            pass`

func procAttempt() attempt {
	return attempt{name: "open another process's memory through /proc", command: `python3 -c '` + procProbe + `' 2>&1`,
		success: []string{"reached-3001", "reached-3002", "reached-3004"}, want: []string{"saw-target"}}
}

// TestEscapeUnjailedDaemonSecret: an unjailed daemon (the operator's
// `cohort intern` without --jail) shares its user with its agent, so its
// secret comes from the environment, never a file the agent could read:
// a command finds it in no process's environment or command line and in
// no file under /tmp (the daemon's secret file of the harness is removed
// once registered, as an operator's EnvironmentFile is root's).
func TestEscapeUnjailedDaemonSecret(t *testing.T) {
	c, gw := newCluster(t, "")
	d := c.Daemon(t, c.NewIntern(t, "unjailed"), nil)
	if err := os.Remove(d.secretFile); err != nil {
		t.Fatal(err)
	}
	want := strings.SplitN("daemon-secret-"+d.id, "-", 2)
	probe := `import os
secret = "` + want[0] + `-" + "` + want[1] + `"
me = str(os.getpid())
seen = 0
for p in os.listdir("/proc"):
    if not p.isdigit() or p == me:
        continue
    for f in ("environ", "cmdline"):
        try:
            b = open("/proc/%s/%s" % (p, f), "rb").read()
            seen += 1
        except OSError:
            continue
        if secret.encode() in b:
            print("found-" + "secret", p, f)
for root, dirs, files in os.walk("/tmp"):
    for n in files:
        try:
            if secret.encode() in open(os.path.join(root, n), "rb").read(1 << 20):
                print("found-" + "secret", os.path.join(root, n))
        except OSError:
            pass
print("scanned", seen)`
	s := readAll(t, chat(t, gw, c.WK, d.id, user(`$ python3 -c '`+probe+`' 2>&1`)))
	if !strings.Contains(s.Text, "scanned") {
		t.Fatalf("the probe did not run: %q", s.Text)
	}
	if strings.Contains(s.Text, "found-secret") {
		t.Fatalf("a command of an unjailed daemon's agent found the daemon's secret:\n%s", s.Text)
	}
}
