package egress_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/httptool"
)

// A streamed Chat Completions event, the size of one token's delta.
const sseChunk = `data: {"id":"chatcmpl-9xQ2mZ","object":"chat.completion.chunk","created":1732600000,"model":"gpt-5-mini","choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}` + "\n\n"

// A key as long as OpenAI's project keys (164 characters), the longest of
// the providers'.
var benchKey = "sk-proj-" + strings.Repeat("Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z", 5)[:156]

// oneChunkPerRead yields n chunks, one per Read, as a streamed upstream
// body does.
type oneChunkPerRead struct{ n int }

func (s *oneChunkPerRead) Read(p []byte) (int, error) {
	if s.n == 0 {
		return 0, io.EOF
	}
	s.n--
	return copy(p, sseChunk), nil
}

// BenchmarkModelRelayRedaction is what redacting the key costs per
// streamed chunk: the redacting reader over one event per read, against
// the same bytes read plain ("none"); and end to end through the relay,
// an upstream flushing each event, with the key (so redacted) and
// without.
func BenchmarkModelRelayRedaction(b *testing.B) {
	const chunks = 1000
	buf := make([]byte, 32<<10)
	for _, c := range []struct {
		name string
		red  bool
	}{{"reader/none", false}, {"reader/redacted", true}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(sseChunk) * chunks))
			for b.Loop() {
				var r io.Reader = &oneChunkPerRead{n: chunks}
				if c.red {
					red := &httptool.Redactor{}
					red.Add(benchKey, placeholder)
					r = red.Reader(r)
				}
				for {
					if _, err := r.Read(buf); err != nil {
						break
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunks), "ns/chunk")
		})
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range chunks {
			io.WriteString(w, sseChunk)
			w.(http.Flusher).Flush()
		}
	}))
	defer upstream.Close()
	for _, c := range []struct {
		name, key string
	}{{"relay/no-key", ""}, {"relay/redacted", benchKey}} {
		b.Run(c.name, func(b *testing.B) {
			r, err := egress.New(egress.Config{ModelBaseURL: upstream.URL + "/v1", ModelAPIKey: c.key, Placeholder: placeholder})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			addr := serveModel(b, r, "")
			client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
			b.SetBytes(int64(len(sseChunk) * chunks))
			for b.Loop() {
				req, _ := http.NewRequestWithContext(context.Background(), "POST", "http://"+addr+"/v1/chat/completions", strings.NewReader("{}"))
				req.Header.Set("Authorization", "Bearer "+placeholder)
				res, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if n != int64(len(sseChunk)*chunks) {
					b.Fatalf("read %d bytes, status %d", n, res.StatusCode)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunks), "ns/chunk")
		})
	}
}

// BenchmarkModelRelayHeldStreams is what the relay holds per open model
// stream (issue 41's memory per stream): 50 streams, each past its first
// event and waiting for the next, redacted (the key set) as a jailed
// intern's are. It reports the gateway's heap and goroutines per stream,
// after a collection.
func BenchmarkModelRelayHeldStreams(b *testing.B) {
	const streams = 50
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, sseChunk)
		w.(http.Flusher).Flush()
		<-release
	}))
	defer upstream.Close()
	defer close(release)
	r, err := egress.New(egress.Config{ModelBaseURL: upstream.URL + "/v1", ModelAPIKey: benchKey, Placeholder: placeholder})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	addr := serveModel(b, r, "")
	var heap, goroutines float64
	for b.Loop() {
		before, g0 := heapInUse()
		var bodies []io.ReadCloser
		for range streams {
			req, _ := http.NewRequestWithContext(context.Background(), "POST", "http://"+addr+"/v1/chat/completions", strings.NewReader("{}"))
			req.Header.Set("Authorization", "Bearer "+placeholder)
			// One connection per stream, as each agent call is.
			res, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
			if err != nil {
				b.Fatal(err)
			}
			first := make([]byte, len(sseChunk))
			if _, err := io.ReadFull(res.Body, first); err != nil {
				b.Fatal(err)
			}
			bodies = append(bodies, res.Body)
		}
		after, g1 := heapInUse()
		heap += float64(after-before) / streams
		goroutines += float64(g1-g0) / streams
		for _, body := range bodies {
			body.Close()
		}
	}
	// The client's side of each stream is in the same process: its
	// transport, connection and body are counted too, alike before and
	// after a change of the relay.
	b.ReportMetric(heap/float64(b.N), "heapB/stream")
	b.ReportMetric(goroutines/float64(b.N), "goroutines/stream")
}

func heapInUse() (uint64, int) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse, runtime.NumGoroutine()
}
