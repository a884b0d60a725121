package internd_test

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// BenchmarkEventsThroughDaemon streams b.N text events from the agent
// (ACP session/update over stdio) through the daemon's run log to a
// consumer attached over h2c Connect. Goal: >= 100,000 events/s. Deltas
// the consumer has not taken yet are coalesced (stream-msgs/event says
// how many stream messages each agent event cost).
func BenchmarkEventsThroughDaemon(b *testing.B) {
	// sdk-agent: the test agent sends each update through acp-go-sdk (its
	// encoding costs more than the daemon's handling); raw-agent: it writes
	// pre-encoded lines, so the daemon is what is measured.
	for _, script := range []string{"stream", "rawstream"} {
		name := map[string]string{"stream": "sdk-agent", "rawstream": "raw-agent"}[script]
		b.Run(name, func(b *testing.B) { benchEvents(b, script) })
	}
}

func benchEvents(b *testing.B, script string) {
	e := newEnv(b)
	if _, err := e.start(b, "warm", "hello", selfDrive); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	s, err := e.c.StartTurn(context.Background(), connect.NewRequest(&pb.StartTurnRequest{SessionId: "bench", Prompt: fmt.Sprintf("%s %d", script, b.N)}))
	if err != nil {
		b.Fatal(err)
	}
	// Each agent update is one "x"; a lagging consumer gets them coalesced
	// into fewer deltas, so count characters.
	n, msgs := 0, 0
	for s.Receive() {
		n += len(s.Msg().GetEvent().GetText().GetText())
		msgs++
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	b.StopTimer()
	if s.Err() != nil || n != b.N {
		b.Fatalf("received %d of %d text updates: %v", n, b.N, s.Err())
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(msgs)/float64(b.N), "stream-msgs/event")
	// CPU this process (the daemon, and the consumer) spent per event: the
	// end-to-end rate also depends on the agent process and on the
	// machine's other load; this does not.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "daemon-cpu-ns/event")
}

// cpuTime is this process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPausedRunMemory holds b.N runs paused on a permission question
// and reports the daemon's memory (heap and goroutine stacks) per paused
// run. Run it with -benchtime=1000x. Goal: <= 64 KB per paused run.
func BenchmarkPausedRunMemory(b *testing.B) {
	e := newEnv(b, func(c *internd.Config) { c.MaxPausedRuns = b.N + 1 })
	if _, err := e.start(b, "warm", "hello", selfDrive); err != nil {
		b.Fatal(err)
	}
	before := memInUse()
	b.ResetTimer()
	for i := range b.N {
		evs, err := e.start(b, fmt.Sprintf("paused-%d", i), "perm", manual)
		if err != nil {
			b.Fatal(err)
		}
		if f := finish(b, evs); f.GetReason() != pb.Finished_REASON_PAUSED {
			b.Fatalf("run %d: %v", i, f)
		}
	}
	b.StopTimer()
	e.c = newClient(e.srv.URL, launch.GatewayCredential(secret)) // drop the client's idle connections from the count
	e.srv.CloseClientConnections()
	after := memInUse()
	if st := e.status(b); int(st.GetPausedRuns()) != b.N {
		b.Fatalf("paused runs: %d, want %d", st.GetPausedRuns(), b.N)
	}
	b.ReportMetric(float64(after-before)/float64(b.N), "bytes/paused-run")
	b.ReportMetric(float64(runtime.NumGoroutine())/float64(b.N), "goroutines/paused-run")
}

// memInUse is the heap and goroutine stacks in use once the goroutines
// that are ending (those of closed connections) have ended: their number
// no longer falls between two looks.
func memInUse() int64 {
	n, looks := runtime.NumGoroutine(), 0
	testutil.Poll(time.Second, func() bool {
		runtime.GC()
		m := runtime.NumGoroutine()
		looks++
		settled := looks > 1 && m >= n
		n = m
		return settled
	})
	var m runtime.MemStats
	for range 2 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}
