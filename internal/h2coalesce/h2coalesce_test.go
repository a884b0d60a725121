package h2coalesce

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// recordingConn keeps every write made on it.
type recordingConn struct {
	net.Conn
	mu     *sync.Mutex
	writes *[][]byte
}

func (c recordingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	*c.writes = append(*c.writes, append([]byte(nil), b...))
	c.mu.Unlock()
	return c.Conn.Write(b)
}

type frame struct {
	typ, flags byte
	stream     uint32
}

// frames splits one write into HTTP/2 frames; the client preface is
// skipped.
func frames(t *testing.T, b []byte) []frame {
	t.Helper()
	b = []byte(strings.TrimPrefix(string(b), "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	var out []frame
	for len(b) > 0 {
		if len(b) < h2FrameHeaderLen {
			t.Fatalf("a write ends inside a frame header: % x", b)
		}
		n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
		out = append(out, frame{b[3], b[4], uint32(b[5]&0x7f)<<24 | uint32(b[6])<<16 | uint32(b[7])<<8 | uint32(b[8])})
		if len(b) < h2FrameHeaderLen+n {
			t.Fatalf("a write ends inside a frame")
		}
		b = b[h2FrameHeaderLen+n:]
	}
	return out
}

// TestCoalescingDialer: through a real h2c server, every request with a
// body leaves as one write holding its HEADERS and its DATA, requests
// without a body are not held, and the server sees what was sent.
func TestCoalescingDialer(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write([]byte(r.Method + " " + string(b)))
	}))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	defer srv.Close()

	var mu sync.Mutex
	var writes [][]byte
	dial := Dialer((&net.Dialer{}).DialContext)
	tr := &http.Transport{Protocols: &p, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// Record below the coalescing layer: what reaches the socket.
		cc := c.(*coalescingConn)
		cc.Conn = recordingConn{cc.Conn, &mu, &writes}
		return cc, nil
	}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	// The first request also carries the connection's SETTINGS exchange: an
	// acknowledgement written between a request's headers and its body goes
	// out with the held headers, in order, so only later requests are
	// counted.
	warm, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, warm.Body)
	warm.Body.Close()
	mu.Lock()
	writes = nil
	mu.Unlock()
	for i, body := range []string{"one", "", "three", strings.Repeat("x", 20000)} {
		method := "POST"
		if body == "" {
			method = "GET"
		}
		req, _ := http.NewRequest(method, srv.URL, strings.NewReader(body))
		if body == "" {
			req.Body = nil
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(got) != method+" "+body {
			t.Fatalf("request %d: got %q", i, got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var posts, gets int
	for _, w := range writes {
		fs := frames(t, w)
		for i, f := range fs {
			if f.typ != h2TypeHeaders {
				continue
			}
			if f.flags&h2FlagEndStream != 0 {
				gets++
				continue
			}
			posts++
			if i+1 >= len(fs) || fs[i+1].typ != 0 || fs[i+1].stream != f.stream {
				t.Errorf("HEADERS of stream %d left without its DATA: %+v", f.stream, fs)
			}
		}
	}
	if posts != 3 || gets != 1 {
		t.Errorf("saw %d requests with a body and %d without, want 3 and 1", posts, gets)
	}
}
