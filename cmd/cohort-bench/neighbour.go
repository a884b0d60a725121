package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/cohort-dev/cohort/internal/store"
)

// abuseCommand is the abusive co-tenant's self-drive shell command, for
// secs seconds (timeout kills its whole process group): what names, of
// burn (a busy loop per core, twice over), hog (a memory hog that starts
// again when the kernel kills it) and bomb (a fork bomb that keeps the
// jail at its process limit, started last: nothing else forks after it),
// or churn (the shell's fork bomb, whose processes die and are born again
// at the limit). Only ever run with the process limit on.
func abuseCommand(secs int, what []string) string {
	var parts []string
	if slices.Contains(what, "burn") {
		parts = append(parts, `for i in 1 2 3 4; do (while :; do :; done) & done`)
	}
	if slices.Contains(what, "hog") {
		parts = append(parts, `(while :; do head -c 5368709120 /dev/zero | tail > /dev/null; done) &`)
	}
	if slices.Contains(what, "bomb") {
		// Every process forks for as long as it lives, refused or not
		// (a shell's bomb dies out at the limit: a refused fork ends dash).
		parts = append(parts, `sleep 1; perl -e "fork while 1"`)
	}
	if slices.Contains(what, "churn") {
		// The shell's fork bomb: at the limit its processes die and are
		// born again all the time.
		parts = append(parts, `sleep 1; b() { b | b & }; b`)
	}
	parts = append(parts, "wait")
	return fmt.Sprintf(`timeout -s KILL %d sh -c '%s' > /dev/null 2>&1; echo abuse over`, secs, strings.Join(parts, "\n"))
}

// benchNeighbour is `cohort-bench neighbour`: one gateway, two jailed
// interns. The neighbour's time to first chunk with an idle co-tenant,
// then with an abusive one (abuseCommand), side by side; then the wake of
// sleeping interns (jail start, daemon and agent start, first chunk) with
// the default limits and with none.
//
//	cohort-bench neighbour [--turns 200] [--wakes 20] [--cohort PATH] [serve flags of the limits-on gateway]
func benchNeighbour(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cohort-bench neighbour", flag.ContinueOnError)
	fs.SetOutput(stderr)
	turns := fs.Int("turns", 200, "the neighbour's turns in each column")
	wakes := fs.Int("wakes", 20, "sleeping interns woken with limits on, and as many with them off (0: none, and no limits-off gateway)")
	rounds := fs.Int("rounds", 3, "idle and abusive columns, alternating")
	abuses := fs.String("abuse", "burn,hog,bomb", "what the abusive co-tenant does: burn, hog, bomb (perl's fork loop), churn (the shell's fork bomb), comma-separated")
	cohortPath := cohortFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Further serve flags for the limits-on gateway (say, one limit off).
	extra := fs.Args()
	cohort, dir, err := benchDir(ctx, "neighbour", *cohortPath, stderr)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(stdout, "load average at start: %s\n", loadavg())

	var wakeOn, wakeOff []time.Duration
	for _, on := range []bool{true, false} {
		if !on && *wakes == 0 {
			break
		}
		data := filepath.Join(dir, fmt.Sprintf("data-%v", on))
		serveArgs := []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", data, "--log-level", "warn",
			"--provisioner", "local", "--intern-idle-timeout", "1h", "--jail-orphan-timeout", "0", "--turn-rate", "100000/s"}
		if !on {
			serveArgs = append(serveArgs, "--intern-memory", "0", "--intern-max-processes", "0", "--intern-cpu-weight", "0",
				"--intern-tmpfs", "0", "--intern-disk", "0")
		} else {
			serveArgs = append(serveArgs, extra...)
		}
		gw := exec.CommandContext(ctx, cohort, serveArgs...)
		base, err := startListening(gw, stderr)
		if err != nil {
			return err
		}
		base += "/api/v1"
		stop := func() { gw.Process.Kill(); gw.Wait() }
		var boot map[string]string
		b, err := os.ReadFile(filepath.Join(data, "bootstrap.json"))
		if err == nil {
			err = json.Unmarshal(b, &boot)
		}
		if err != nil {
			stop()
			return err
		}
		wk, demo := boot["workspace_key"], boot["intern_id"]
		db, err := store.Open(ctx, "", data)
		if err != nil {
			stop()
			return err
		}
		var tmpl store.Intern
		err = db.NewSelect().Model(&tmpl).Where("id = ?", demo).Scan(ctx)
		ids := make([]string, *wakes+1)
		var rows []store.Intern
		for i := range ids {
			ids[i] = uuid.NewString()
			rows = append(rows, store.Intern{ID: ids[i], OrganizationID: tmpl.OrganizationID, WorkspaceID: tmpl.WorkspaceID,
				Name: fmt.Sprintf("n-%03d", i), Model: tmpl.Model, State: store.InternSleeping, CreatedBy: tmpl.CreatedBy, CreatedAt: time.Now()})
		}
		if err == nil {
			_, err = db.NewInsert().Model(&rows).Exec(ctx)
		}
		db.Close()
		if err != nil {
			stop()
			return err
		}
		// Wakes: each a jail started with (or without) its limits.
		var woke []time.Duration
		for _, id := range ids[1:] {
			d, err := fleetTurn(ctx, base, wk, id)
			if err != nil {
				stop()
				return fmt.Errorf("wake: %w", err)
			}
			woke = append(woke, d)
		}
		if on {
			wakeOn = woke
		} else if len(woke) > 0 {
			wakeOff = woke
			stop()
			break
		}
		neighbour := ids[0]
		if _, err := fleetTurn(ctx, base, wk, demo); err != nil {
			stop()
			return err
		}
		column := func() ([]time.Duration, error) {
			var out []time.Duration
			for range *turns {
				d, err := fleetTurn(ctx, base, wk, neighbour)
				if err != nil {
					return nil, err
				}
				out = append(out, d)
				time.Sleep(20 * time.Millisecond)
			}
			return out, nil
		}
		// Rounds alternate the two columns, so that the host's own noise
		// (other work on it) falls on both alike.
		var idle, abusive []time.Duration
		var pids int
		var abuser, load string
		for range *rounds {
			i, err := column()
			if err != nil {
				stop()
				return fmt.Errorf("idle column: %w", err)
			}
			idle = append(idle, i...)
			// The abuse outlasts the abusive column: 5 s to reach its
			// limits, then three times the idle column's time.
			secs := 10 + int(3*(sum(i).Seconds()+float64(*turns)*0.02))
			abuse := make(chan string, 1)
			go func() { abuse <- selfDrive(ctx, base, wk, demo, abuseCommand(secs, strings.Split(*abuses, ","))) }()
			time.Sleep(5 * time.Second)
			peak := make(chan int)
			done := make(chan struct{})
			go func() { peak <- peakPids(done) }()
			a, err := column()
			close(done)
			pids = max(pids, <-peak)
			load = loadavg()
			if err != nil {
				stop()
				return fmt.Errorf("abusive column: %w", err)
			}
			abusive = append(abusive, a...)
			abuser = <-abuse
		}
		fmt.Fprintf(stdout, "== the neighbour's time to first chunk, %d rounds of %d turns each (limits on: the defaults %s; abuse: %s)\n", *rounds, *turns, strings.Join(extra, " "), *abuses)
		fmt.Fprintf(stdout, "%-28s %12s %12s\n", "", "idle", "abusive")
		fmt.Fprintf(stdout, "%-28s %12s %12s\n", "p50", percentile(idle, .5).Round(10*time.Microsecond), percentile(abusive, .5).Round(10*time.Microsecond))
		fmt.Fprintf(stdout, "%-28s %12s %12s\n", "p99", percentile(idle, .99).Round(10*time.Microsecond), percentile(abusive, .99).Round(10*time.Microsecond))
		fmt.Fprintf(stdout, "abusive/idle: p50 %.2fx, p99 %.2fx (goal ≤ 1.5x); load average at the end of the last abuse %s\n",
			float64(percentile(abusive, .5))/float64(percentile(idle, .5)), float64(percentile(abusive, .99))/float64(percentile(idle, .99)), load)
		fmt.Fprintf(stdout, "the abuser's last turn: %s\n", abuser)
		fmt.Fprintf(stdout, "most processes in one jail during the abusive columns (pids.current): %d\n", pids)
		stop()
	}
	if *wakes == 0 {
		return nil
	}
	fmt.Fprintf(stdout, "== wake of a sleeping intern, chat request → first chunk (%d each)\n", *wakes)
	fmt.Fprintf(stdout, "limits on:  p50 %s p99 %s\n", percentile(wakeOn, .5).Round(100*time.Microsecond), percentile(wakeOn, .99).Round(100*time.Microsecond))
	fmt.Fprintf(stdout, "limits off: p50 %s p99 %s\n", percentile(wakeOff, .5).Round(100*time.Microsecond), percentile(wakeOff, .99).Round(100*time.Microsecond))
	return nil
}

func sum(v []time.Duration) time.Duration {
	var s time.Duration
	for _, d := range v {
		s += d
	}
	return s
}

// selfDrive runs one `$ ` turn of the demo model and returns how it
// ended (the tool's exit code, or the error).
func selfDrive(ctx context.Context, base, key, id, command string) string {
	body, _ := json.Marshal(map[string]any{"stream": true, "messages": []map[string]string{{"role": "user", "content": "$ " + command}}})
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/interns/"+id+"/chat/completions", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	s := string(b)
	if i := strings.Index(s, `exit_code`); i >= 0 {
		s = s[i:]
		if j := strings.Index(s, `,\"sandboxed`); j >= 0 {
			s = s[:j]
		}
		return fmt.Sprintf("%d, %s", res.StatusCode, strings.ReplaceAll(s, `\`, ""))
	}
	return fmt.Sprintf("%d %s", res.StatusCode, s[:min(len(s), 300)])
}

// peakPids samples the jails' pids.current (this host's v1 or v2
// layouts) until done and returns the largest: the fork bomb at its limit.
func peakPids(done <-chan struct{}) int {
	most := 0
	for {
		var files []string
		for _, g := range []string{"/sys/fs/cgroup/pids/cohort-jail-*/pids.current", "/sys/fs/cgroup/pids/*/cohort-jail-*/pids.current",
			"/sys/fs/cgroup/*/cohort-jail-*/pids.current", "/sys/fs/cgroup/cohort-jail-*/pids.current"} {
			m, _ := filepath.Glob(g)
			files = append(files, m...)
		}
		for _, f := range files {
			b, _ := os.ReadFile(f)
			var n int
			fmt.Sscan(string(b), &n)
			most = max(most, n)
		}
		select {
		case <-done:
			return most
		case <-time.After(200 * time.Millisecond):
		}
	}
}
