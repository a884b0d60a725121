package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"
)

// User is an unprivileged host user made for a test (see NewUser).
type User struct {
	Name     string
	UID, GID int
	// Groups are its supplementary groups' gids.
	Groups []int
}

// NewUser creates a host user (and its own group) for the test, a member
// of the extra groups (created too), with a subordinate uid and gid range
// if subIDs; the test's cleanup deletes them all. It needs root: without
// it, or with subIDs without newuidmap and newgidmap, the test is skipped
// (failed under CI).
func NewUser(t testing.TB, prefix string, subIDs bool, groups ...string) User {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("creating a test user needs root")
		}
		t.Skip("SKIPPING: creating a test user needs root")
	}
	if subIDs {
		for _, tool := range []string{"newuidmap", "newgidmap"} {
			if _, err := exec.LookPath(tool); err != nil {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s is missing: .ci/run installs Debian's uidmap package", tool)
				}
				t.Skipf("!!! SKIPPING: a gateway user with a subordinate range needs %s (Debian's uidmap package; CI installs it)", tool)
			}
		}
	}
	var b [3]byte
	rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	u := User{Name: prefix + suffix}
	var gnames []string
	for _, g := range groups {
		name := g + suffix
		run(t, "groupadd", name)
		t.Cleanup(func() { run(nil, "groupdel", name) })
		gnames = append(gnames, name)
	}
	args := []string{"--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group"}
	if len(gnames) > 0 {
		args = append(args, "--groups", strings.Join(gnames, ","))
	}
	if !subIDs {
		args = append(args, "-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0")
	}
	run(t, "useradd", append(args, u.Name)...)
	// userdel also removes its subordinate ranges.
	t.Cleanup(func() { run(nil, "userdel", u.Name) })
	pw, err := user.Lookup(u.Name)
	if err != nil {
		t.Fatal(err)
	}
	u.UID, _ = strconv.Atoi(pw.Uid)
	u.GID, _ = strconv.Atoi(pw.Gid)
	for _, g := range gnames {
		gr, err := user.LookupGroup(g)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := strconv.Atoi(gr.Gid)
		u.Groups = append(u.Groups, id)
	}
	if subIDs && !hasRange("/etc/subuid", u.Name) {
		// This useradd allocates none by itself: take one past the others.
		start := 1_500_000_000 + int(b[0])<<16
		r := fmt.Sprintf("%d-%d", start, start+65535)
		run(t, "usermod", "--add-subuids", r, "--add-subgids", r, u.Name)
	}
	return u
}

func hasRange(file, name string) bool {
	b, _ := os.ReadFile(file)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, name+":") {
			return true
		}
	}
	return false
}

// run runs an account tool, retrying while another holds the files' lock
// (tests of several packages make users at once). t nil: a cleanup that
// only tries.
func run(t testing.TB, name string, args ...string) {
	var out []byte
	var err error
	for i := 0; i < 50; i++ {
		out, err = exec.Command(name, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "lock") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil && t != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}
