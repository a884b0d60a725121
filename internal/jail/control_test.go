package jail_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/jail"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// controlProgram runs in a Control jail: it says what it could reach, then
// asks the relay every 50 ms and prints the answers, until SIGTERM.
func controlProgram() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() {
		<-term
		fmt.Println("bye")
		os.Exit(7)
	}()
	_, err := net.Dial("unixpacket", os.Getenv("JAILTEST_CONTROL"))
	fmt.Printf("dial control: %v\n", err != nil)
	// Sockets show in /proc/net/unix of the network namespace they were
	// made in: no socket of the host's, named by a path, shows here.
	named := []string{}
	if b, err := os.ReadFile("/proc/net/unix"); err != nil {
		named = append(named, err.Error())
	} else {
		for _, l := range strings.Split(string(b), "\n")[1:] {
			if f := strings.Fields(l); len(f) >= 8 {
				named = append(named, f[7])
			}
		}
	}
	fmt.Printf("named sockets in /proc/net/unix: %v\n", named)
	// The init's descriptors (the control listener among them): listing
	// them may work in a user-namespace jail, following them must not.
	reached := []string{}
	fds, _ := os.ReadDir("/proc/1/fd")
	for _, fd := range fds {
		p := "/proc/1/fd/" + fd.Name()
		if l, err := os.Readlink(p); err == nil {
			reached = append(reached, "readlink "+fd.Name()+" "+l)
		}
		if c, err := net.Dial("unixpacket", p); err == nil {
			c.Close()
			reached = append(reached, "dial "+fd.Name())
		}
		if f, err := os.Open(p); err == nil {
			f.Close()
			reached = append(reached, "open "+fd.Name())
		}
	}
	fmt.Printf("reached the init's descriptors: %v\n", reached)
	// The init must not pass on a changed SIGPIPE: the program's pipes
	// break as usual (SigIgn is a hex mask; SIGPIPE is bit 13-1).
	ignored := "?"
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "SigIgn:"); ok {
				var mask uint64
				fmt.Sscanf(strings.TrimSpace(v), "%x", &mask)
				ignored = fmt.Sprint(mask&(1<<(13-1)) != 0)
			}
		}
	}
	fmt.Printf("SIGPIPE ignored: %s\n", ignored)
	for i := 0; ; i++ {
		fmt.Printf("dialing %d\n", i)
		c, err := net.Dial("tcp", "127.0.0.1:7100")
		if err != nil {
			fmt.Println("relay:", err)
		} else {
			fmt.Fprintf(c, "tick %d\n", i)
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			fmt.Printf("relay: %s\n", strings.TrimSpace(line))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// answer serves j's relay connections, tagging each answer with who.
func answer(j *jail.Jail, who string) {
	for {
		_, c, err := j.Accept()
		if err != nil {
			return
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Fprintf(c, "%s:%s", who, line)
		c.Close()
	}
}

func startControl(t *testing.T, userNS bool, orphan time.Duration, out *testutil.SyncBuffer) (*jail.Jail, string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A long path: longer than a socket address holds.
	ctl := filepath.Join(t.TempDir(), strings.Repeat("d", 60), "ctl.sock")
	os.MkdirAll(filepath.Dir(ctl), 0o700)
	spec := jail.Spec{
		Argv:   []string{"/run/jailtest", "-test.run=^$"},
		Env:    []string{"JAILTEST_PROGRAM=control", "JAILTEST_CONTROL=" + ctl},
		Binds:  append(jail.SystemBinds(), jail.Bind{Src: self, Dst: "/run/jailtest"}),
		Relays: []jail.Relay{{Port: 7100, Kind: 'e'}},
		UID:    2000000001, GID: 2000000001, UserNS: userNS,
		Control: ctl, Orphan: orphan, Tag: "jail-one",
	}
	j, err := jail.Start(spec, jail.Options{Stderr: os.Stderr, Output: out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		j.Process.Kill()
		j.Wait()
	})
	return j, ctl
}

// A Control jail outlives its caller: relays, output and signals go to
// whichever caller attached last, connections made between two callers
// wait for the next, and nothing inside the jail reaches the control socket.
func TestControlJailOutlivesItsCaller(t *testing.T) {
	needNamespaces(t)
	for _, userNS := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userNS), func(t *testing.T) {
			if !userNS && os.Geteuid() != 0 {
				t.Skip("the dedicated-uid jail needs root")
			}
			first := &testutil.SyncBuffer{}
			j1, ctl := startControl(t, userNS, time.Minute, first)
			go answer(j1, "first")
			testutil.Eventually(t, 20*time.Second, "the first caller's answers", func() bool {
				return strings.Contains(first.String(), "relay: first:tick")
			})
			for _, line := range []string{"dial control: true", "named sockets in /proc/net/unix: []", "reached the init's descriptors: []", "SIGPIPE ignored: false"} {
				if !strings.Contains(first.String(), line) {
					t.Errorf("the program's report lacks %q:\n%s", line, first)
				}
			}

			// Asking whether the jail is alive takes nothing over.
			if !jail.Alive(ctl) {
				t.Fatal("a running jail is not alive")
			}
			before := strings.Count(first.String(), "relay: first:")
			testutil.Eventually(t, 10*time.Second, "the first caller still answers after Alive", func() bool {
				return strings.Count(first.String(), "relay: first:") > before+2
			})

			// The caller goes; the program goes on, its next relay
			// connection waits for the next caller.
			j1.Detach()
			<-j1.Done()
			time.Sleep(300 * time.Millisecond) // output made while detached is dropped and counted
			if _, ok := j1.Exit(); ok {
				t.Fatal("the jail exited when its caller left")
			}
			second := &testutil.SyncBuffer{}
			j2, err := jail.Attach(ctl, second)
			if err != nil {
				t.Fatal(err)
			}
			if j2.Tag() != "jail-one" || j2.Pid() != j1.Process.Pid {
				t.Errorf("attached tag %q pid %d, want jail-one and %d", j2.Tag(), j2.Pid(), j1.Process.Pid)
			}
			go answer(j2, "second")
			testutil.Eventually(t, 10*time.Second, "the second caller's answers", func() bool {
				return strings.Contains(second.String(), "relay: second:tick")
			})
			if strings.Contains(second.String(), "relay: first:") {
				t.Errorf("the second caller got the first's answers:\n%s", second)
			}
			if !strings.Contains(second.String(), "bytes of output were dropped while no caller was attached") {
				t.Errorf("no word of the output dropped between callers:\n%s", second)
			}

			// A third caller takes over from the second.
			third := &testutil.SyncBuffer{}
			j3, err := jail.Attach(ctl, third)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-j2.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the second caller was not let go when the third attached")
			}
			go answer(j3, "third")
			if err := j3.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-j3.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the jail did not end on SIGTERM through its control socket")
			}
			if code, ok := j3.Exit(); !ok || code != 7 {
				t.Errorf("exit %d (%v), want the program's 7", code, ok)
			}
			if !strings.Contains(third.String(), "bye") {
				t.Errorf("the program's last words did not reach the caller:\n%s", third)
			}
			st, _ := j1.Wait()
			if st.ExitCode() != 7 {
				t.Errorf("the init exited %v", st)
			}
			if _, err := jail.Attach(ctl, nil); err == nil {
				t.Error("attached to a jail that has ended")
			}
		})
	}
}

// With no caller for Spec.Orphan (as the last caller set it) the jail
// stops its program; Kill through the control socket ends it at once.
func TestControlJailOrphanAndKill(t *testing.T) {
	needNamespaces(t)
	out := &testutil.SyncBuffer{}
	j, ctl := startControl(t, true, time.Hour, out)
	go answer(j, "first")
	testutil.Eventually(t, 20*time.Second, "the jail runs", func() bool { return strings.Contains(out.String(), "relay: first:") })
	j.Detach()
	next, err := jail.Attach(ctl, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := next.SetOrphan(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	next.Detach()
	done := make(chan struct{})
	go func() { j.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an orphaned jail kept running")
	}
	if st, _ := j.Wait(); st.ExitCode() != 7 {
		t.Errorf("the orphaned jail exited %v, want the program's 7 (it got SIGTERM)", st)
	}

	out2 := &testutil.SyncBuffer{}
	j2, ctl2 := startControl(t, true, time.Minute, out2)
	go answer(j2, "first")
	testutil.Eventually(t, 20*time.Second, "the jail runs", func() bool { return strings.Contains(out2.String(), "relay: first:") })
	j2.Detach()
	a, err := jail.Attach(ctl2, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Kill()
	done = make(chan struct{})
	go func() { j2.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Kill through the control socket did not end the jail")
	}
	if _, err := jail.Start(jail.Spec{Argv: []string{"/bin/true"}, Control: ctl2, UserNS: true}, jail.Options{}); err != nil {
		t.Errorf("a stale control socket kept a new jail from starting: %v", err)
	}
}
