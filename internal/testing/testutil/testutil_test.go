package testutil_test

import (
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

func TestPoll(t *testing.T) {
	t.Parallel()
	n := 0
	if !testutil.Poll(time.Minute, func() bool { n++; return n == 3 }) || n != 3 {
		t.Fatalf("Poll stopped after %d calls", n)
	}
	start := time.Now()
	if testutil.Poll(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll reported a condition that never held")
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("Poll gave up after %v, before its timeout", d)
	}
}

func TestClock(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := testutil.NewClock(t0)
	c.Add(90 * time.Second)
	if got := c.Now(); !got.Equal(t0.Add(90 * time.Second)) {
		t.Fatalf("after Add: %v", got)
	}
	c.Set(t0)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("after Set: %v", got)
	}
}

// An h2c server and client: the request arrives over HTTP/2 with the
// bearer credential, and the caller's request is left as it was.
func TestH2CWithBearer(t *testing.T) {
	t.Parallel()
	srv := testutil.ServeH2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto+" "+r.Header.Get("Authorization"))
	}))
	for tok, want := range map[string]string{"tok": "HTTP/2.0 Bearer tok", "": "HTTP/2.0 "} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		res, err := testutil.H2CClient(tok).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != want {
			t.Errorf("token %q: server saw %q, want %q", tok, b, want)
		}
		if h := req.Header.Get("Authorization"); h != "" {
			t.Errorf("the caller's request was changed: Authorization %q", h)
		}
	}
}

func TestSyncBuffer(t *testing.T) {
	t.Parallel()
	var b testutil.SyncBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 800 {
		t.Fatalf("%d bytes written, want 800", n)
	}
}
