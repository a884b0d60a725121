package localjail

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/egress"
)

// acceptFrom is a jail's relay source for tests: each connection to the
// returned address arrives as one of kind, as the jail's init hands them
// over.
func acceptFrom(t *testing.T, kind byte) (string, func() (byte, net.Conn, error)) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String(), func() (byte, net.Conn, error) {
		c, err := ln.Accept()
		return kind, c, err
	}
}

// One jail holding relay connections past its cap: the excess are closed
// at once, and another intern's jail still reaches its model relay.
func TestServeRelaysCapsOneJailNotItsNeighbour(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		fmt.Fprint(w, "answer")
	}))
	defer upstream.Close()
	const limit = 16
	r, err := egress.New(egress.Config{ModelBaseURL: upstream.URL + "/v1", MaxConnsPerIntern: limit})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	greedy, acceptA := acceptFrom(t, KindModel)
	neighbour, acceptB := acceptFrom(t, KindModel)
	go serveRelays("intern-a", r, "", nil, acceptA)
	go serveRelays("intern-b", r, "", nil, acceptB)

	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range limit {
		c, err := net.Dial("tcp", greedy)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for deadline := time.Now().Add(10 * time.Second); r.Open("intern-a") != limit; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("intern-a holds %d", r.Open("intern-a"))
		}
	}
	for range 3 * limit {
		c, err := net.Dial("tcp", greedy)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
			t.Fatalf("a connection past the cap was kept: %v", err)
		}
		c.Close()
	}
	res, err := (&http.Client{Timeout: 10 * time.Second}).Post("http://"+neighbour+"/v1/chat/completions", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(b) != "answer" {
		t.Fatalf("the neighbour's model relay: %d %q", res.StatusCode, b)
	}
}
