package agent_test

import (
	"context"
	"strconv"
	"testing"

	acp "github.com/coder/acp-go-sdk"

	"github.com/cohort-dev/cohort/internal/agent"
	"github.com/cohort-dev/cohort/internal/agent/agenttest"
)

// BenchmarkStreamedAnswer measures the session/update events per second the
// agent emits for a long streamed answer: a scripted upstream streams n
// chunks (text, or reasoning and text alternating) per turn over loopback
// HTTP, the agent turns each into an ACP update over in-process pipes, and
// the SDK's client side decodes them.
func BenchmarkStreamedAnswer(b *testing.B) {
	const m = "bench/model"
	for _, c := range []struct {
		name      string
		n         int
		reasoning bool
	}{
		{"text/chunks=1000", 1000, false},
		{"text+reasoning/chunks=1000", 1000, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			chunks := make([]string, 0, c.n+2)
			for i := range c.n {
				if c.reasoning && i%2 == 1 {
					chunks = append(chunks, agenttest.Reasoning(m, "reasoning", "thought "+strconv.Itoa(i)+" "))
				} else {
					chunks = append(chunks, agenttest.Text(m, "word"+strconv.Itoa(i)+" "))
				}
			}
			chunks = append(chunks, agenttest.Finish(m, "stop"), agenttest.Usage(m, 10, c.n, -1, -1))
			up := agenttest.NewUpstream(b)
			h := start(b, agent.Config{Model: m, BaseURL: up.BaseURL()}, nil)
			events := 0
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				up.Push(agenttest.Step{Chunks: chunks})
				h.fresh(b) // a fresh session, so history does not grow across iterations
				h.client.Reset()
				b.StartTimer()
				resp := h.mustPrompt(b, "go", agent.ModeManual)
				if resp.StopReason != acp.StopReasonEndTurn {
					b.Fatalf("stop %q", resp.StopReason)
				}
				events += len(h.client.Updates())
			}
			if events < c.n*b.N {
				b.Fatalf("%d events for %d turns of %d chunks", events, b.N, c.n)
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		})
	}
	b.Run("demo", func(b *testing.B) {
		h := start(b, agent.Config{}, nil)
		events := 0
		for range b.N {
			b.StopTimer()
			h.fresh(b)
			h.client.Reset()
			b.StartTimer()
			h.mustPrompt(b, "hello", agent.ModeManual)
			events += len(h.client.Updates())
		}
		b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	})
}

// fresh starts a new session on the harness's connection.
func (h *harness) fresh(tb testing.TB) {
	tb.Helper()
	s, err := h.conn.NewSession(context.Background(), acp.NewSessionRequest{Cwd: h.dir, McpServers: []acp.McpServer{}})
	if err != nil {
		tb.Fatal(err)
	}
	h.session = s.SessionId
}
