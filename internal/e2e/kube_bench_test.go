package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/cohort-dev/cohort/internal/procstat"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// freeAddrs are n distinct loopback addresses nothing listens on now.
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	var out []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		out = append(out, ln.Addr().String())
	}
	return out
}

// kubeCalls sums a gateway's cohort_kube_api_requests_total.
func kubeCalls(t testing.TB, metricsAddr string) float64 {
	t.Helper()
	res, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "cohort_kube_api_requests_total{") {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			sum += v
		}
	}
	return sum
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// Wakes of a sleeping intern on the test cluster, through two replicas
// in turn: from the chat request to its first chunk (the Pod created,
// "scheduled", started, ready and dialed), and the Kubernetes API requests
// both replicas made for it.
//
//	go test ./internal/e2e -run '^$' -bench KubernetesWake -benchtime 30x
func BenchmarkKubernetesWake(b *testing.B) {
	addrs := freeAddrs(b, 2)
	ma, mb := addrs[0], addrs[1]
	f := newKubeFleet(b, "--intern-idle-timeout", "1s")
	// Again, each with its metrics; A where the Pods reach the gateway.
	f.a.Stop(b)
	f.b.Stop(b)
	f.a = f.c.Gateway(b, append([]string{"--no-bootstrap", "--listen", strings.TrimPrefix(f.a.URL, "http://"), "--metrics-listen", ma}, f.args...)...)
	f.b = f.c.Gateway(b, append([]string{"--no-bootstrap", "--metrics-listen", mb}, f.args...)...)
	id, c := f.c.Demo, f.c
	turnOK(b, f.a, c.WK, id, "hello")
	var wakes []time.Duration
	var calls []float64
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		testutil.Eventually(b, wait, "the intern sleeps", func() bool {
			_, ok := f.pod(b, id)
			return !ok && f.state(b, id) == "sleeping"
		})
		before := kubeCalls(b, ma) + kubeCalls(b, mb)
		gw := []*proc{f.a, f.b}[i%2]
		b.StartTimer()
		began := time.Now()
		s := open(b, chat(b, gw, c.WK, id, user("hello again")))
		if ok, err := s.next(); !ok || err != nil {
			b.Fatalf("first chunk: %v", err)
		}
		wakes = append(wakes, time.Since(began))
		b.StopTimer()
		for {
			if ok, err := s.next(); !ok || err != nil {
				break
			}
		}
		// The Lease is given back just after the row says running.
		time.Sleep(200 * time.Millisecond)
		calls = append(calls, kubeCalls(b, ma)+kubeCalls(b, mb)-before)
		b.StartTimer()
	}
	b.StopTimer()
	fc := make([]time.Duration, len(calls))
	for i, v := range calls {
		fc[i] = time.Duration(v)
	}
	b.ReportMetric(float64(percentile(wakes, 0.5).Microseconds())/1000, "wake-p50-ms")
	b.ReportMetric(float64(percentile(wakes, 0.99).Microseconds())/1000, "wake-p99-ms")
	b.ReportMetric(float64(percentile(fc, 0.5)), "api-calls/wake")
	b.ReportMetric(0, "ns/op")
}

// The memory of two gateway replicas before and after 10,000 interns are
// registered (asleep, each with its claim's worth of row), after both
// replicas have reconciled them several times.
//
//	go test ./internal/e2e -run '^$' -bench KubernetesFleetMemory -benchtime 1x
func BenchmarkKubernetesFleetMemory(b *testing.B) {
	f := newKubeFleet(b, "--intern-idle-timeout", "1s")
	turnOK(b, f.a, f.c.WK, f.c.Demo, "hello")
	settle := func() (float64, float64) {
		time.Sleep(5 * time.Second) // five sweeps
		return procstat.PSS(f.a.cmd.Process.Pid) / (1 << 20), procstat.PSS(f.b.cmd.Process.Pid) / (1 << 20)
	}
	a0, b0 := settle()
	ctx := context.Background()
	db, err := store.Open(ctx, f.c.dbArgs[3], f.c.dataDir) // the gateways' database
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	const n = 10_000
	rows := make([]store.Intern, 0, 1000)
	now := time.Now().UTC()
	for i := range n {
		rows = append(rows, store.Intern{ID: uuid.NewString(), OrganizationID: f.c.Org, WorkspaceID: f.c.WS,
			Name: fmt.Sprintf("fleet-%d", i), Model: "cohort/demo", State: store.InternSleeping, CreatedBy: "bench", CreatedAt: now, Provisioner: "kubernetes"})
		if len(rows) == cap(rows) {
			if _, err := db.NewInsert().Model(&rows).Exec(ctx); err != nil {
				b.Fatal(err)
			}
			rows = rows[:0]
		}
	}
	a1, b1 := settle()
	b.ReportMetric(a0, "replica-a-MiB-0")
	b.ReportMetric(b0, "replica-b-MiB-0")
	b.ReportMetric(a1, "replica-a-MiB-10k")
	b.ReportMetric(b1, "replica-b-MiB-10k")
	b.ReportMetric((a1+b1-a0-b0)*(1<<20)/(2*n), "B/intern/replica")
	b.ReportMetric(0, "ns/op")
}
