package internd

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/internd/launch"
)

// Handler serves InternDaemonService (and GET /healthz, unauthenticated,
// which says only that the process is up).
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	opts := connect.WithHandlerOptions(
		connect.WithInterceptors(apierr.ConnectInterceptor(d.log), secretInterceptor{sum: sha256.Sum256([]byte(launch.GatewayCredential(d.cfg.Secret)))}),
		// Run events are small: gzip per event costs more than it saves
		// (most of the CPU of a stream, measured). The bound is above the
		// largest merged text delta (maxMerged, and the built-in agent's
		// own merged updates), so a stream of merged deltas is not gzipped
		// either (docs/benchmarks.md, "Chat": "What got the chat path here").
		connect.WithCompressMinBytes(8192),
	)
	mux.Handle(interndv1connect.NewInternDaemonServiceHandler(service{d}, opts))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	return mux
}

// HTTPServer serves h over HTTP/1.1 and h2c. There is no write timeout:
// run streams last as long as their turns.
func HTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{Handler: h, Protocols: &p, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
}

// BufferReads makes each connection ln accepts read through a 4 KiB buffer.
// The HTTP/2 server reads its frames straight from the connection, a
// frame's 9-byte header and then its payload, each a system call: a
// turn's request (headers, data, window updates, settings) was about 14
// reads where one or two carry the same bytes. Under gVisor's ptrace
// platform each read is a round trip to the Sentry before the turn can
// start (ADR 0996). HTTP/1's own 4 KiB reads pass the buffer by.
func BufferReads(ln net.Listener) net.Listener { return bufListener{ln} }

type bufListener struct{ net.Listener }

func (l bufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &bufConn{Conn: c, r: bufio.NewReaderSize(c, 4<<10)}, nil
}

// bufConn is a connection whose reads go through r.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite is the connection's own (TCP or unix), which net/http uses
// to close an HTTP/1 connection gracefully.
func (c *bufConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// secretInterceptor admits calls that carry the gateway's credential (see
// GatewayCredential; never the secret itself) as a bearer token. Both sides
// are hashed first, so the comparison is constant-time whatever the
// lengths.
type secretInterceptor struct{ sum [32]byte }

func (s secretInterceptor) check(h http.Header) error {
	tok, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	got := sha256.Sum256([]byte(tok))
	if !ok || subtle.ConstantTimeCompare(got[:], s.sum[:]) != 1 {
		return apierr.Unauthenticated("missing or invalid daemon secret")
	}
	return nil
}

func (s secretInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := s.check(req.Header()); err != nil {
			return nil, apierr.ToConnect(err)
		}
		return next(ctx, req)
	}
}

func (s secretInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (s secretInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := s.check(conn.RequestHeader()); err != nil {
			return apierr.ToConnect(err)
		}
		return next(ctx, conn)
	}
}

// service is the Connect door onto the daemon.
type service struct{ d *Daemon }

var _ interndv1connect.InternDaemonServiceHandler = service{}

func (s service) StartTurn(ctx context.Context, req *connect.Request[pb.StartTurnRequest], st *connect.ServerStream[pb.StartTurnResponse]) error {
	s.d.touch()
	defer s.d.touch()
	r, err := s.d.StartTurn(ctx, req.Msg)
	if err != nil {
		return err
	}
	return r.stream(ctx, 1, func(ev *pb.RunEvent) error { return st.Send(&pb.StartTurnResponse{Event: ev}) })
}

func (s service) Answer(ctx context.Context, req *connect.Request[pb.AnswerRequest], st *connect.ServerStream[pb.AnswerResponse]) error {
	s.d.touch()
	defer s.d.touch()
	r, from, err := s.d.Answer(ctx, req.Msg)
	if err != nil {
		return err
	}
	return r.stream(ctx, from, func(ev *pb.RunEvent) error { return st.Send(&pb.AnswerResponse{Event: ev}) })
}

func (s service) Attach(ctx context.Context, req *connect.Request[pb.AttachRequest], st *connect.ServerStream[pb.AttachResponse]) error {
	s.d.touch()
	defer s.d.touch()
	r, err := s.d.Attach(req.Msg)
	if err != nil {
		return err
	}
	return r.stream(ctx, req.Msg.GetFromSeq(), func(ev *pb.RunEvent) error { return st.Send(&pb.AttachResponse{Event: ev}) })
}

func (s service) Cancel(ctx context.Context, req *connect.Request[pb.CancelRequest]) (*connect.Response[pb.CancelResponse], error) {
	s.d.touch()
	return connect.NewResponse(&pb.CancelResponse{Cancelled: s.d.Cancel(req.Msg)}), nil
}

func (s service) Status(ctx context.Context, req *connect.Request[pb.StatusRequest]) (*connect.Response[pb.StatusResponse], error) {
	return connect.NewResponse(s.d.Status()), nil
}
