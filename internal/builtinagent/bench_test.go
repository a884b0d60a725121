package builtinagent_test

import (
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/cohort-dev/cohort/internal/builtinagent"
	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
	"github.com/cohort-dev/cohort/internal/internd/acptap"
)

// BenchmarkStreamedAnswer measures the model chunks per second the agent
// carries for a long streamed answer: a scripted upstream streams n chunks
// (text, or reasoning and text alternating) per turn over loopback HTTP,
// the agent turns them into ACP updates over in-process pipes, and the
// SDK's client side decodes them. Chunks of one kind that reach the agent
// together go out as one update (updates/chunk says how many updates a
// chunk cost; alternating kinds are never merged, so there it is 1).
func BenchmarkStreamedAnswer(b *testing.B) {
	const m = "bench/model"
	for _, c := range []struct {
		name      string
		n         int
		reasoning bool
		// tap: the client reads text chunks as the intern daemon does
		// (acptap), not with the SDK's generic decoding, whose cost is
		// then most of what is measured.
		tap bool
	}{
		{"text/chunks=1000", 1000, false, false},
		{"text+reasoning/chunks=1000", 1000, true, false},
		{"tap-client/text/chunks=1000", 1000, false, true},
		{"tap-client/text+reasoning/chunks=1000", 1000, true, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			chunks := make([]string, 0, c.n+2)
			var wantText, wantThought strings.Builder
			for i := range c.n {
				if c.reasoning && i%2 == 1 {
					s := "thought " + strconv.Itoa(i) + " "
					chunks = append(chunks, agenttest.Reasoning(m, "reasoning", s))
					wantThought.WriteString(s)
				} else {
					s := "word" + strconv.Itoa(i) + " "
					chunks = append(chunks, agenttest.Text(m, s))
					wantText.WriteString(s)
				}
			}
			chunks = append(chunks, agenttest.Finish(m, "stop"), agenttest.Usage(m, 10, c.n, -1, -1))
			up := agenttest.NewUpstream(b)
			var tapped struct {
				sync.Mutex
				n             int
				text, thought strings.Builder
			}
			var read func(io.Reader) io.Reader
			if c.tap {
				read = func(r io.Reader) io.Reader {
					_, rest := acptap.Start(r, func(u acptap.Update) {
						tapped.Lock()
						defer tapped.Unlock()
						tapped.n++
						if u.Thought {
							tapped.thought.WriteString(u.Text)
						} else {
							tapped.text.WriteString(u.Text)
						}
					})
					return rest
				}
			}
			h := startReading(b, builtinagent.Config{Model: m, BaseURL: up.BaseURL()}, nil, read)
			events := 0
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for range b.N {
				b.StopTimer()
				up.Push(agenttest.Step{Chunks: chunks})
				h.fresh(b) // a fresh session, so history does not grow across iterations
				h.client.Reset()
				tapped.Lock()
				tapped.n = 0
				tapped.text.Reset()
				tapped.thought.Reset()
				tapped.Unlock()
				b.StartTimer()
				resp := h.mustPrompt(b, "go", builtinagent.ModeManual)
				if resp.StopReason != acp.StopReasonEndTurn {
					b.Fatalf("stop %q", resp.StopReason)
				}
				b.StopTimer()
				text, thought := h.client.Text(), h.client.Thought()
				events += len(h.client.Updates())
				if c.tap {
					// The tap hands text on before the SDK reads the
					// response that follows it.
					tapped.Lock()
					text, thought = tapped.text.String(), tapped.thought.String()
					events += tapped.n
					tapped.Unlock()
				}
				if text != wantText.String() || thought != wantThought.String() {
					b.Fatalf("the client did not get the streamed text and reasoning")
				}
				b.StartTimer()
			}
			// CPU of the whole process (upstream, agent and client) per
			// chunk: unlike the rates, hardly moved by the machine's other
			// load. It includes the setup between turns.
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(c.n*b.N), "cpu-ns/chunk")
			b.ReportMetric(float64(c.n*b.N)/b.Elapsed().Seconds(), "chunks/s")
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64(events)/float64(c.n*b.N), "updates/chunk")
		})
	}
	b.Run("demo", func(b *testing.B) {
		h := start(b, builtinagent.Config{}, nil)
		events := 0
		for range b.N {
			b.StopTimer()
			h.fresh(b)
			h.client.Reset()
			b.StartTimer()
			h.mustPrompt(b, "hello", builtinagent.ModeManual)
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

// cpuTime is this process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
