// Package procstat reads what benchmarks report of processes from Linux's
// /proc: a process's descendants and its proportional set size.
package procstat

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Tree lists pid and its descendants, pid first.
func Tree(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so after the last ')'.
		s := string(st)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 {
			pp, _ := strconv.Atoi(f[1])
			children[pp] = append(children[pp], p)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// PSS is a process's proportional set size in bytes (0 when it is gone):
// its private memory plus its share of pages it shares, such as the text
// of a binary many processes run.
func PSS(pid int) float64 { return kB(fmt.Sprintf("/proc/%d/smaps_rollup", pid), "Pss:") }

// Rollup is one field of a process's /proc/PID/smaps_rollup ("Pss_Anon:",
// "Pss_File:"…) in bytes (0 when it is gone).
func Rollup(pid int, field string) float64 {
	return kB(fmt.Sprintf("/proc/%d/smaps_rollup", pid), field)
}

// RSS is a process's resident set size in bytes (0 when it is gone).
func RSS(pid int) float64 { return kB(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:") }

// kB reads the "<field> N kB" line of a /proc file, in bytes.
func kB(path, field string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			n, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return n * 1024
		}
	}
	return 0
}

// TreePSS sums PSS over pid's tree.
func TreePSS(pid int) float64 {
	var total float64
	for _, p := range Tree(pid) {
		total += PSS(p)
	}
	return total
}
