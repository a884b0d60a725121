package e2e_test

import (
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// One intern turns abusive (a memory hog, a disk fill, a full /tmp, CPU
// burn on every core and a 2,000-process fork storm, all in one self-drive
// shell command) while a second intern's turns keep answering. Each abuse
// hits its jail's limit and says so in the abuser's own stream; the
// neighbour never notices beyond a bounded slowdown.
//
// ESCAPE_LIMITS_OFF=1 runs the same with every limit at 0 (the storm is
// of sleeping processes, the hog and fills are sized to be harmless to
// the host): the test must then fail, which is how its assertions were
// checked to prove something.
func TestEscapeLimits(t *testing.T) {
	limits := []string{"--intern-memory", "1GiB", "--intern-max-processes", "512", "--intern-disk", "256MiB", "--intern-tmpfs", "64MiB"}
	if os.Getenv("ESCAPE_LIMITS_OFF") == "1" {
		limits = []string{"--intern-memory", "0", "--intern-max-processes", "0", "--intern-disk", "0", "--intern-tmpfs", "0", "--intern-cpu-weight", "0"}
	}
	c, gw := newCluster(t, "", append([]string{"--provisioner", "local", "--log-level", "info", "--turn-rate", "10000/m"}, limits...)...)
	tg := &target{c: c, gw: gw}
	neighbour := createIntern(t, gw, c.MK, c.WS, "neighbour")
	tg.waitRunning(t, c.Demo)
	tg.waitRunning(t, neighbour)

	// The neighbour's turns, from before the abuse until after it.
	var (
		mu    sync.Mutex
		turns []time.Duration
		fails []string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			res := chat(t, gw, c.WK, neighbour, user("hello, neighbour"))
			if res.StatusCode != 200 {
				res.Body.Close()
				mu.Lock()
				fails = append(fails, res.Status)
				mu.Unlock()
				continue
			}
			s := readAll(t, res)
			d := time.Since(start)
			mu.Lock()
			turns = append(turns, d)
			if s.Finish != "stop" || s.Text == "" || d > 15*time.Second {
				fails = append(fails, s.Finish+" "+d.String()+" "+s.Text)
			}
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}()

	abuse := strings.Join([]string{
		// tail holds its last line: 2 GiB of zeros with no newline.
		`head -c 2147483648 /dev/zero | tail > /dev/null; echo "hog-status-$?"`,
		`head -c 536870912 /dev/zero > /intern/fill; echo "fill-status-$? fill-size-$(wc -c < /intern/fill)"; rm -f /intern/fill`,
		`head -c 134217728 /dev/zero > /tmp/fill; echo "tmp-status-$?"; rm -f /tmp/fill`,
		`for i in 1 2 3 4; do timeout -s KILL 20 sh -c 'while :; do :; done' & done`,
		// (Not piped: the sleepers would hold the pipe open.)
		`(for i in $(seq 2000); do sleep 15 & done) 2>&1`,
		// Counted with builtins: no fork is left.
		`set -- /proc/[0-9]*; echo "procs-$#"; echo abuse-$((40+2))`,
	}, "; ")
	time.Sleep(2 * time.Second) // idle turns first
	s := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ "+abuse)))
	out := s.Text
	time.Sleep(15 * time.Second) // the burn and the storm go on
	// A command that is itself OOM-killed: the tool names the limit.
	hog := readAll(t, chat(t, gw, c.WK, c.Demo, user("$ head -c 2147483648 /dev/zero | tail > /dev/null")))
	out += hog.Text
	close(stop)
	wg.Wait()

	if !strings.Contains(out, "abuse-42") {
		t.Fatalf("the abuse did not run to its end: finish %q error %v text %q", s.Finish, s.Error, tail(out, 3000))
	}
	t.Logf("the abuser's stream: %s", tail(out, 1500))
	for _, want := range []struct{ what, s string }{
		{"the hog was not OOM-killed", "Killed\\nhog-status-137"},
		{"the stream does not name the memory limit", "memory limit"},
		{"the disk fill was not stopped at 256 MiB", "fill-size-268435456"},
		{"the /tmp fill was not refused", "No space left on device"},
		{"the fork storm was not refused", "fork"},
	} {
		if !strings.Contains(out, want.s) {
			t.Errorf("%s (no %q in the stream)", want.what, want.s)
		}
	}
	for _, line := range strings.Split(out, `\n`) {
		if n, ok := strings.CutPrefix(line, "procs-"); ok && atoi(n) > 512 {
			t.Errorf("%s processes ran in a jail limited to 512", n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(fails) > 0 {
		t.Errorf("the neighbour noticed: %d of %d turns failed or took over 15 s: %v", len(fails), len(turns), fails)
	}
	sorted := append([]time.Duration(nil), turns...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	if len(sorted) < 5 {
		t.Fatalf("the neighbour answered only %d turns during the abuse", len(sorted))
	}
	t.Logf("the neighbour's %d turns: p50 %v, max %v", len(sorted), sorted[len(sorted)/2], sorted[len(sorted)-1])
	select {
	case <-gw.done:
		t.Fatal("the gateway died")
	default:
	}
	// What the host cannot enforce is said at start: here, the disk as a
	// whole (RLIMIT_FSIZE bounds each file).
	if os.Getenv("ESCAPE_LIMITS_OFF") != "1" && !strings.Contains(gw.stderr.String(), "an intern limit is not enforced on this host") {
		t.Error("the gateway did not say at start which limit it cannot enforce")
	}
}
