package egress_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
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
