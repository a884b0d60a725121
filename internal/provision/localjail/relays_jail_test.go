//go:build linux

package localjail

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/jail"
)

// TestMain: the test binary doubles as the program inside the jails of
// TestRelayCapWithRealJails.
func TestMain(m *testing.M) {
	switch os.Getenv("LOCALJAILTEST_PROGRAM") {
	case "hold":
		holdConns()
	case "model":
		callModel()
	}
	os.Exit(m.Run())
}

// holdConns opens $N connections to the model relay, reports how many the
// gateway closed at once and how many it kept, and holds them until its
// stdin closes.
func holdConns() {
	n, _ := strconv.Atoi(os.Getenv("LOCALJAILTEST_N"))
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", PortModel))
		if err != nil {
			fmt.Println(`{"err":` + strconv.Quote(err.Error()) + `}`)
			os.Exit(1)
		}
		conns = append(conns, c)
	}
	time.Sleep(500 * time.Millisecond)
	// All at once: the gateway closes a connection that sends no request
	// within its ReadHeaderTimeout, which one by one could reach.
	var out struct{ Open, Closed int }
	open := make(chan bool, len(conns))
	deadline := time.Now().Add(200 * time.Millisecond)
	for _, c := range conns {
		go func() {
			c.SetReadDeadline(deadline)
			_, err := c.Read(make([]byte, 1))
			open <- errors.Is(err, os.ErrDeadlineExceeded)
		}()
	}
	for range conns {
		if <-open {
			out.Open++
		} else {
			out.Closed++
		}
	}
	json.NewEncoder(os.Stdout).Encode(out)
	select {}
}

// callModel makes five model requests through the relay, each on a new
// connection, and prints the last status and body and the slowest's time.
func callModel() {
	var slowest time.Duration
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for range 5 {
		start := time.Now()
		res, err := client.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", PortModel), "application/json", strings.NewReader("{}"))
		if err != nil {
			fmt.Println("error", err)
			os.Exit(0)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		slowest = max(slowest, time.Since(start))
		if res.StatusCode != 200 {
			fmt.Println(res.StatusCode, string(b))
			os.Exit(0)
		}
	}
	fmt.Println(200, "answer", slowest.Microseconds())
	os.Exit(0)
}

// startProgram runs this test binary as program in a jail whose model
// relay goes to r as intern's, and returns its stdout.
func startProgram(t *testing.T, r *egress.Relay, intern, program string, env ...string) (*bufio.Reader, *jail.Jail) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, _ := os.Pipe()
	t.Cleanup(func() { outR.Close() })
	uid := jailUID(intern)
	spec := jail.Spec{
		Argv:   []string{"/run/jailtest", "-test.run=^$"},
		Env:    append([]string{"LOCALJAILTEST_PROGRAM=" + program}, env...),
		Binds:  append(jail.SystemBinds(), jail.Bind{Src: self, Dst: "/run/jailtest"}),
		Relays: []jail.Relay{{Port: PortModel, Kind: KindModel}},
		UID:    uid, GID: uid,
	}
	j, err := jail.Start(spec, jail.Options{Stdout: outW, Stderr: os.Stderr})
	outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Process.Kill(); <-j.Done() })
	go serveRelays(intern, r, "", nil, j.Accept)
	return bufio.NewReader(outR), j
}

// One real jail holding relay connections past its cap: the gateway closes
// the excess at once and keeps the rest; a second jail's model relay still
// answers meanwhile.
func TestRelayCapWithRealJails(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPING: jails with their own uids need root")
	}
	if err := jail.Probe(jail.Spec{Binds: jail.SystemBinds(), UID: 2000000001, GID: 2000000001}); err != nil {
		t.Skipf("SKIPPING: this machine cannot make jails: %v", err)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fmt.Fprint(w, "answer")
	}))
	defer upstream.Close()
	const limit, tries = 16, 64
	r, err := egress.New(egress.Config{ModelBaseURL: upstream.URL + "/v1", MaxConnsPerIntern: limit})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	// The neighbour alone first: its slowest model call on an idle relay.
	idle := neighbourCall(t, r)

	out, _ := startProgram(t, r, "jail-greedy", "hold", "LOCALJAILTEST_N="+strconv.Itoa(tries))
	line, err := out.ReadString('\n')
	if err != nil {
		t.Fatalf("the greedy jail: %q %v", line, err)
	}
	var got struct{ Open, Closed int }
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	if got.Open != limit || got.Closed != tries-limit {
		t.Fatalf("of %d connections the gateway kept %d and closed %d; want %d and %d", tries, got.Open, got.Closed, limit, tries-limit)
	}
	if n := r.Open("jail-greedy"); n != limit {
		t.Fatalf("the relay counts %d for the greedy jail", n)
	}

	// While it holds them, the neighbour's model calls go through.
	loaded := neighbourCall(t, r)
	t.Logf("the neighbour's slowest of 5 model calls: %v alone, %v beside a jail at its cap of %d (%d tried)", idle, loaded, limit, tries)
}

// neighbourCall runs the model program in a jail of its own and returns
// its slowest call's time.
func neighbourCall(t *testing.T, r *egress.Relay) time.Duration {
	t.Helper()
	nout, nj := startProgram(t, r, "jail-neighbour", "model")
	answer, _ := nout.ReadString('\n')
	<-nj.Done()
	var status, us int
	var body string
	if _, err := fmt.Sscan(answer, &status, &body, &us); err != nil || status != 200 || body != "answer" {
		t.Fatalf("the neighbour's model call: %q", answer)
	}
	return time.Duration(us) * time.Microsecond
}
