package e2e_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// An intern's own limits reach its jail: its cgroups' memory and pids
// bounds and its RLIMIT_FSIZE are its own while a neighbour keeps the
// operator's; a change of them through the admin CLI replaces the jail on
// the gateway's next look at the row, with the new bounds.
//
// LIMITS_OVERRIDE_OFF=1 creates the intern without its own limits: the
// test must then fail (how its assertions were checked).
func TestInternOwnLimitsReachItsJail(t *testing.T) {
	c, gw := newCluster(t, "", "--provisioner", "local", "--log-level", "info",
		"--intern-memory", "1GiB", "--intern-max-processes", "512", "--intern-disk", "256MiB")
	tg := &target{c: c, gw: gw}
	body := `{"workspace_id":"` + c.WS + `","name":"small","limits":{"memory_bytes":"134217728","max_processes":48,"disk_bytes":"1048576"}}`
	if os.Getenv("LIMITS_OVERRIDE_OFF") == "1" {
		body = `{"workspace_id":"` + c.WS + `","name":"small"}`
	}
	small := createInternWith(t, gw, c.MK, body)["id"]
	tg.waitRunning(t, small)
	tg.waitRunning(t, c.Demo)

	// From the host: the cgroups of each intern's jail.
	if mem, pids := jailBounds(t, small); mem != "134217728" || pids != "48" {
		t.Errorf("the intern's jail has memory %s and pids %s, want its own 134217728 and 48", mem, pids)
	}
	if mem, pids := jailBounds(t, c.Demo); mem != "1073741824" || pids != "512" {
		t.Errorf("the neighbour's jail has memory %s and pids %s, want the operator's 1073741824 and 512", mem, pids)
	}

	// From inside: the file size bound, and fork refused past 48.
	probe := `grep "Max file size" /proc/self/limits; (for i in $(seq 100); do sleep 3 & done) 2>&1 | tail -n 1; set -- /proc/[0-9]*; echo "procs-$#"`
	out := readAll(t, chat(t, gw, c.WK, small, user("$ "+probe))).Text
	t.Logf("the intern's command: %s", tail(out, 600))
	if !strings.Contains(out, "1048576") {
		t.Errorf("the intern's RLIMIT_FSIZE is not its own 1 MiB: %s", tail(out, 600))
	}
	if !strings.Contains(out, "fork") {
		t.Errorf("100 processes were not refused in a jail of 48: %s", tail(out, 600))
	}
	for _, line := range strings.Split(out, `\n`) {
		if n, ok := strings.CutPrefix(line, "procs-"); ok && atoi(n) > 48 {
			t.Errorf("%s processes ran in a jail limited to 48", n)
		}
	}

	// A change through the CLI: the jail is replaced with the new bounds.
	c.Admin(t, "intern", "update", "--org", c.Org, "--id", small, "--max-processes", "40", "--memory", "96MiB", "--disk", "2MiB")
	testutil.Eventually(t, 3*wait, "the intern's jail has its new limits", func() bool {
		mem, pids := jailBoundsOrNone(small)
		return mem == "100663296" && pids == "40"
	})
	tg.waitRunning(t, small)
	out = readAll(t, chat(t, gw, c.WK, small, user(`$ grep "Max file size" /proc/self/limits`))).Text
	if !strings.Contains(out, "2097152") {
		t.Errorf("the replaced jail's RLIMIT_FSIZE is not 2 MiB: %s", tail(out, 600))
	}
}

// jailBounds reads, from the host, the memory and pids bounds of the
// cgroups (v1) of the intern's daemon.
func jailBounds(t *testing.T, intern string) (mem, pids string) {
	t.Helper()
	var found bool
	testutil.Eventually(t, wait, "the daemon of "+intern, func() bool {
		mem, pids = jailBoundsOrNone(intern)
		found = mem != "" || pids != ""
		return found
	})
	return mem, pids
}

// jailBoundsOrNone finds the daemon by its --intern-id argument and reads
// its cgroups' memory.limit_in_bytes and pids.max ("" where none).
func jailBoundsOrNone(intern string) (mem, pids string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("--intern-id\x00"+intern+"\x00")) || !bytes.Contains(b, []byte("\x00intern\x00")) {
			continue
		}
		cg, err := os.ReadFile(filepath.Join(filepath.Dir(p), "cgroup"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(cg), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 || !strings.Contains(filepath.Base(parts[2]), "cohort-jail-") {
				continue
			}
			for _, ctrl := range strings.Split(parts[1], ",") {
				switch ctrl {
				case "memory":
					mem = readTrim(filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes"))
				case "pids":
					pids = readTrim(filepath.Join("/sys/fs/cgroup/pids", parts[2], "pids.max"))
				}
			}
		}
		if mem != "" || pids != "" {
			return mem, pids
		}
	}
	return "", ""
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(string(b))
	if _, err := strconv.ParseInt(s, 10, 64); err != nil && s != "max" {
		return ""
	}
	return s
}
