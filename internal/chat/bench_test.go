package chat_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// benchChunk is the content chunk every variant moves.
func benchChunk() *cohortv1.ChatCompletionChunk {
	text := "hello world, this is one streamed token "
	return &cohortv1.ChatCompletionChunk{Id: "chatcmpl-test", Object: "chat.completion.chunk", Created: 1795262400, Model: model,
		Choices: []*cohortv1.ChatChoice{{Delta: &cohortv1.ChatDelta{Content: &text}}}}
}

// repeat is a Source yielding the same chunk n times.
type repeat struct {
	c *cohortv1.ChatCompletionChunk
	n int
}

func (r *repeat) Next() (*cohortv1.ChatCompletionChunk, error) {
	if r.n == 0 {
		return nil, io.EOF
	}
	r.n--
	return r.c, nil
}

func drain(b *testing.B, client *http.Client, req *http.Request) {
	res, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b.Fatal(res.StatusCode)
	}
	if _, err := io.Copy(io.Discard, res.Body); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRelay measures the cost of one chunk (ns/op is per chunk: one
// stream carries b.N chunks) along three paths over loopback HTTP/1.1, in
// the same run:
//   - bare: a handler writing the pre-encoded `data:` event and flushing,
//     the floor any SSE server pays;
//   - sse_adapter: internal/sse encoding each chunk from its typed form,
//     with the pump goroutine and keepalive timer;
//   - gateway: the full relay, a scripted daemon streaming b.N text events
//     over Connect (h2c) to the orchestration, then the REST door and the
//     adapter.
func BenchmarkRelay(b *testing.B) {
	c := benchChunk()
	event := sse.Event(nil, c)

	b.Run("bare", func(b *testing.B) {
		n := b.N
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			rc := http.NewResponseController(w)
			for range n {
				w.Write(event)
				rc.Flush()
			}
			w.Write([]byte("data: [DONE]\n\n"))
		}))
		defer srv.Close()
		req, _ := http.NewRequest("GET", srv.URL, nil)
		b.ReportAllocs()
		b.ResetTimer()
		drain(b, srv.Client(), req)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "chunks/s")
	})

	b.Run("sse_adapter", func(b *testing.B) {
		n := b.N
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sse.Serve(w, r, &repeat{c: c, n: n}, sse.Options{})
		}))
		defer srv.Close()
		req, _ := http.NewRequest("GET", srv.URL, nil)
		b.ReportAllocs()
		b.ResetTimer()
		drain(b, srv.Client(), req)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "chunks/s")
	})

	for _, v := range []struct {
		name string
		opts []connect.ClientOption
	}{
		{"gateway", nil},
		// Without gzip on the daemon hop: connect-go otherwise compresses
		// every small event with a fresh gzip writer.
		{"gateway_no_gzip", []connect.ClientOption{connect.WithAcceptCompression("gzip", nil, nil)}},
	} {
		b.Run(v.name, func(b *testing.B) { benchGateway(b, c, v.opts...) })
		// The daemon hop alone: a Connect client reading the same b.N
		// events straight from the scripted daemon, as the gateway does.
		b.Run(strings.Replace(v.name, "gateway", "daemon_hop", 1), func(b *testing.B) { benchHop(b, c, v.opts...) })
	}
}

func benchHop(b *testing.B, c *cohortv1.ChatCompletionChunk, opts ...connect.ClientOption) {
	d := newDaemon(b, opts...)
	d.set(flood(b.N, c), nil)
	b.ReportAllocs()
	b.ResetTimer()
	res, err := d.client.StartTurn(context.Background(), connect.NewRequest(&interndv1.StartTurnRequest{Prompt: "go"}))
	if err != nil {
		b.Fatal(err)
	}
	for res.Receive() {
	}
	if res.Err() != nil {
		b.Fatal(res.Err())
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "chunks/s")
}

// flood is a daemon script streaming n copies of c's text.
func flood(n int, c *cohortv1.ChatCompletionChunk) script {
	ev := textEv(model, c.GetChoices()[0].GetDelta().GetContent())
	return func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(started("sess-1"))
		for range n {
			if err := send(ev); err != nil {
				return err
			}
		}
		return send(stopEv(model))
	}
}

func benchGateway(b *testing.B, c *cohortv1.ChatCompletionChunk, opts ...connect.ClientOption) {
	{
		d := newDaemon(b, opts...)
		e := newEnv(b, storetest.SQLite(b), func(s *server.Server) { s.Chat.Daemons = daemons{d: d} })
		e.d = d
		sc := flood(b.N, c)
		e.d.set(sc, sc)
		req, _ := http.NewRequest("POST", e.URL+"/interns/"+e.InternID+"/chat/completions", strings.NewReader(userBody("go")))
		req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
		b.ReportAllocs()
		b.ResetTimer()
		drain(b, e.HTTPClient(), req)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "chunks/s")
	}
}

// BenchmarkEncode is the adapter's encoding alone, per chunk.
func BenchmarkEncode(b *testing.B) {
	c := benchChunk()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = sse.Event(buf[:0], c)
	}
}

// BenchmarkTurn is the gateway's cost per turn (ns/op is per turn): the
// time from sending a prompt to reading the first content chunk, for a
// scripted daemon that answers at once (Started, one text event, stop).
//   - daemon_alone: a Connect client calling the scripted daemon directly,
//     as `cohort-bench chat` calibrates against the real one;
//   - gateway_sqlite, gateway_postgres: the REST door in front of the
//     same daemon (authentication, the intern's row, the rate limiter, the
//     second hop, the SSE encoding) on each database.
//
// The difference between daemon_alone and a gateway variant is what the
// gateway adds to the time to first chunk.
func BenchmarkTurn(b *testing.B) {
	c := benchChunk()
	text := c.GetChoices()[0].GetDelta().GetContent()
	sc := events(nil, started("sess-1"), textEv(model, text), stopEv(model))
	// Like the real daemon's events, the scripted daemon's are not gzipped.
	noGzip := connect.WithAcceptCompression("gzip", nil, nil)
	// The scripted daemon reports every call's end on a bounded channel.
	discardEnded := func(b *testing.B, d *daemon) {
		stop := make(chan struct{})
		b.Cleanup(func() { close(stop) })
		go func() {
			for {
				select {
				case <-d.ended:
				case <-stop:
					return
				}
			}
		}()
	}

	b.Run("daemon_alone", func(b *testing.B) {
		d := newDaemon(b, noGzip)
		d.set(sc, sc)
		discardEnded(b, d)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			res, err := d.client.StartTurn(ctx, connect.NewRequest(&interndv1.StartTurnRequest{SessionId: "sess-1", Prompt: "go"}))
			if err != nil {
				b.Fatal(err)
			}
			for res.Receive() {
				if res.Msg().GetEvent().GetText() != nil {
					break
				}
			}
			res.Close()
		}
	})
	for _, db := range []struct {
		name string
		open func(testing.TB) *bun.DB
	}{{"gateway_sqlite", storetest.SQLite}, {"gateway_postgres", storetest.Postgres}} {
		b.Run(db.name, func(b *testing.B) {
			// The limiter stays in the path, at a rate the loop cannot reach.
			lim, err := ratelimit.NewMemory(ratelimit.Rate{Events: 1 << 30, Period: time.Second, Burst: 1 << 30}, nil)
			if err != nil {
				b.Fatal(err)
			}
			d := newDaemon(b, noGzip)
			e := newEnv(b, db.open(b), func(s *server.Server) { s.Chat.Daemons, s.Chat.Limiter = daemons{d: d}, lim })
			e.d = d
			e.d.set(sc, sc)
			discardEnded(b, e.d)
			client := e.HTTPClient()
			body := userBody("go")
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("POST", e.URL+"/interns/"+e.InternID+"/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
				res, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				if res.StatusCode != 200 {
					b.Fatal(res.StatusCode)
				}
				br := bufio.NewReader(res.Body)
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						b.Fatal("no content chunk: ", err)
					}
					if bytes.Contains(line, []byte(`"content"`)) {
						break
					}
				}
				io.Copy(io.Discard, br)
				res.Body.Close()
			}
		})
	}
}
