package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The floor of one hop on this machine: what the e2e figures are divided
// by (docs/benchmarks.md, "Round 7: the floor"). Both relays stand in front
// of the mock model, each its own process, so schedstat charges the hop
// alone:
//
//   - relay-tcp: socket to socket, bytes through unchanged: a read from one
//     socket and a write to the other per chunk (a plain loop, not io.Copy,
//     whose splice would hide the copy this floor is meant to price);
//   - relay-sse: a bare Go SSE proxy: net/http in, net/http out, each
//     upstream event read as a line and written to the caller with a flush.
//
// Neither checks anything, keeps anything or sets any deadline: they are
// what a hop costs before it does any work of its own.

// floorRelay runs one of the relays (mode tcp or sse) in front of upstream
// (the model's base URL) and prints its address.
func floorRelay(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) != 2 {
		return errors.New("floor-relay: want MODE UPSTREAM (tcp|sse, http://host:port)")
	}
	up, err := url.Parse(args[1])
	if err != nil {
		return err
	}
	switch args[0] {
	case "tcp":
		return relayTCP(ctx, up.Host, stdout)
	case "sse":
		return benchServe(ctx, relaySSE(up), stdout)
	}
	return fmt.Errorf("floor-relay: mode %q is not tcp or sse", args[0])
}

func relayTCP(ctx context.Context, upstream string, stdout io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); ln.Close() }()
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		dst.(*net.TCPConn).CloseWrite()
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				return
			}
			defer u.Close()
			done := make(chan struct{})
			go func() { pipe(u, c); close(done) }()
			pipe(c, u)
			<-done
		}()
	}
}

func relaySSE(up *url.URL) http.Handler {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), "POST", up.Scheme+"://"+up.Host+r.URL.Path, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		fl := w.(http.Flusher)
		br := bufio.NewReader(res.Body)
		for {
			line, err := br.ReadSlice('\n')
			if len(bytes.TrimSpace(line)) > 0 {
				w.Write(line)
				w.Write([]byte{'\n'})
				fl.Flush()
			}
			if err != nil {
				return
			}
		}
	})
}

// floorTargets starts both relays in front of the model and returns them
// as e2e targets with their processes.
func floorTargets(self, modelURL string, hc *http.Client, logs io.Writer) ([]*e2eTarget, []e2eProc, []func(), error) {
	var (
		targets []*e2eTarget
		procs   []e2eProc
		stops   []func()
	)
	for _, m := range []struct{ mode, name, proc string }{
		{"tcp", "floor: bare relay hop", "floor-tcp"},
		{"sse", "floor: bare SSE relay hop", "floor-sse"},
	} {
		c, err := startBenchChild(self, nil, logs, "floor-relay", m.mode, modelURL)
		if err != nil {
			for _, s := range stops {
				s()
			}
			return nil, nil, nil, err
		}
		stops = append(stops, c.stop)
		targets = append(targets, &e2eTarget{name: m.name, url: c.url + "/v1/chat/completions", hc: hc, own: []string{m.proc}})
		procs = append(procs, e2eProc{m.proc, c.cmd.Process.Pid})
	}
	return targets, procs, stops, nil
}

// paceLate is how far behind the model's pace each chunk of a stream
// arrived: chunk k is due at the first chunk's arrival plus k intervals.
func paceLate(arrivals []time.Duration, interval time.Duration) []time.Duration {
	late := make([]time.Duration, 0, len(arrivals))
	for k, a := range arrivals {
		late = append(late, max(0, a-arrivals[0]-time.Duration(k)*interval))
	}
	return late
}

// timed sends prompt and reads the stream to [DONE], returning the time to
// the first content chunk and, for each model token, when it arrived (from
// the request's start).
func (t *e2eTarget) timed(ctx context.Context, prompt string) (time.Duration, []time.Duration, error) {
	t0 := time.Now()
	res, err := t.request(ctx, prompt)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	var at []time.Duration
	br := bufio.NewReaderSize(res.Body, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if n := bytes.Count(line, []byte(`token `)); n > 0 && bytes.Contains(line, []byte(`"content":"token `)) {
			d := time.Since(t0)
			for range n {
				at = append(at, d)
			}
		}
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			if len(at) == 0 {
				return 0, nil, errors.New("no content chunk")
			}
			return at[0], at, nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, nil, errors.New("the stream ended without [DONE]")
			}
			return 0, nil, err
		}
	}
}

// e2eScale runs n paced streams at once through each target, for each n of
// counts in turn, and reports the largest n that meets the bar: time to
// first chunk p99 ≤ 50 ms and every stream's chunks within 20 ms of the
// model's pace (p99 of every chunk's lateness), at that n and every smaller
// one. A target goes on past the bar (its CPU per chunk at higher n is a
// figure too) but stops at an error or a time to first chunk p99 over 1 s.
// perTurn, when the turns phase ran, is each target's CPU per one-chunk
// turn, taken off each stream as the paced phase does.
func e2eScale(ctx context.Context, stdout io.Writer, targets []*e2eTarget, procs []e2eProc, perTurn map[*e2eTarget]time.Duration, counts string, chunks int, interval, ramp time.Duration) error {
	var ns []int
	for _, f := range strings.Split(counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("--scale: %q is not a stream count", f)
		}
		ns = append(ns, n)
	}
	const ttfcBar, lateBar = 50 * time.Millisecond, 20 * time.Millisecond
	fmt.Fprintf(stdout, "\n== scale: N paced streams at once (%d chunks each, one per %v, starts spread over %v); bar: time to first chunk p99 ≤ %v, chunk lateness p99 ≤ %v\n",
		chunks, interval, ramp, ttfcBar, lateBar)
	what := "CPU per chunk, each stream's turn included"
	if len(perTurn) > 0 {
		what = "CPU per chunk, a turn's cost taken off each stream"
	}
	fmt.Fprintf(stdout, "(%s)\n", what)
	fmt.Fprintf(stdout, "%-34s %6s %10s %10s %12s %12s %14s %s\n", "path", "N", "ttfc p50", "ttfc p99", "late p99", "late max", "CPU per chunk", "")
	best, prev := map[*e2eTarget]int{}, map[*e2eTarget]int{}
	for _, t := range targets {
		for _, n := range ns {
			s0 := e2eSnap(procs)
			var (
				mu    sync.Mutex
				ttfc  []time.Duration
				late  []time.Duration
				first error
				wg    sync.WaitGroup
			)
			for k := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(time.Duration(k) * ramp / time.Duration(n))
					f, at, err := t.timed(ctx, benchPrompt(chunks, interval, false))
					if err == nil && len(at) != chunks {
						err = fmt.Errorf("%d of %d chunks arrived", len(at), chunks)
					}
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						if first == nil {
							first = err
						}
						return
					}
					ttfc = append(ttfc, f)
					late = append(late, paceLate(at, interval)...)
				}()
			}
			wg.Wait()
			time.Sleep(50 * time.Millisecond)
			s1 := e2eSnap(procs)
			var cpu time.Duration
			for _, name := range t.own {
				cpu += s1[name] - s0[name]
			}
			cpu = max(0, cpu-perTurn[t]*time.Duration(n))
			if len(ttfc) == 0 {
				ttfc, late = []time.Duration{0}, []time.Duration{0}
			}
			verdict := "ok"
			if first != nil {
				verdict = "FAIL: " + first.Error()
			} else if percentile(ttfc, .99) > ttfcBar || percentile(late, .99) > lateBar {
				verdict = "over the bar"
			}
			fmt.Fprintf(stdout, "%-34s %6d %10v %10v %12v %12v %14v %s\n", t.name, n, us(percentile(ttfc, .5)), us(percentile(ttfc, .99)),
				us(percentile(late, .99)), us(slices.Max(append(late, 0))), us1(cpu/time.Duration(n*chunks)), verdict)
			if verdict == "ok" && best[t] == prev[t] {
				best[t] = n
			}
			prev[t] = n
			if first != nil || percentile(ttfc, .99) > time.Second {
				break
			}
		}
	}
	for _, t := range targets {
		fmt.Fprintf(stdout, "%-34s largest N at the bar: %d (%d chunks/s)\n", t.name, best[t], best[t]*int(time.Second/interval))
	}
	return nil
}

// e2eRuns is, for each process, how many times one of its threads has been
// put on a CPU so far (schedstat's third field, summed over its threads):
// its wake-ups, plus preemptions. Per chunk it moves less with the
// machine's load than CPU time does.
func e2eRuns(procs []e2eProc) map[string]int64 {
	m := make(map[string]int64, len(procs))
	for _, p := range procs {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.pid))
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", p.pid, t.Name()))
			if f := strings.Fields(string(b)); err == nil && len(f) == 3 {
				n, _ := strconv.ParseInt(f[2], 10, 64)
				m[p.name] += n
			}
		}
	}
	return m
}
