package provision

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
)

// A daemon address a backend routed to a unix socket (Host.Route) is dialed
// there by the daemons' client, over h2c as any daemon; once undone, the
// address is dialed again (here nothing listens on it).
func TestRouteDialsTheSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "daemon.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "via the socket "+r.Proto)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	// An address nothing listens on: a port of a listener closed at once.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := closed.Addr().String()
	closed.Close()

	p := &Provisioner{}
	p.init()
	undo := p.route(addr, sock)
	res, err := p.client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != "via the socket HTTP/2.0" {
		t.Fatalf("answer %q", body)
	}
	undo()
	if c, err := p.dialDaemon(context.Background(), "tcp", addr); err == nil {
		c.Close()
		t.Fatal("the address was dialed through the socket after undo")
	}
}
