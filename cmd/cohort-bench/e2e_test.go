package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestBenchE2E runs `cohort-bench e2e` small against real processes (the
// mock model, a gateway, a daemon beside it and its agent), with the guard's
// lines and a small scale phase: every path answers (the floor's two relays
// too), every paced chunk arrives through Cohort (the command fails
// otherwise), and the figures the guard reads are there.
func TestBenchE2E(t *testing.T) {
	bin := cohortBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errs strings.Builder
	err := benchE2E(ctx, []string{"--cohort", bin, "--provisioner", "remote", "--peer-dir=", "--guard", "--turns", "5",
		"--paced-chunks", "20", "--paced-streams", "2", "--paced-rounds", "1",
		"--scale", "1,2", "--scale-chunks", "5", "--scale-ramp", "10ms"}, &out, &errs)
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errs.String())
	}
	o := out.String()
	for _, re := range []string{`processes: gateway \d+, daemon \d+, agent \d+, floor-tcp \d+, floor-sse \d+, model \d+`,
		`(?m)^Cohort, new session\s+\S+\s+\S+\s+\S+\s+\S+$`, `(?m)^Cohort, continued session\s+\S+\s+\S+\s+\S+\s+\S+$`,
		`(?m)^Cohort, new session\s+path \S+\s+\(gateway \S+, daemon \S+, agent \S+, floor-tcp \S+, floor-sse \S+, model \S+\)`,
		`(?m)^floor: bare relay hop\s+path \S+`, `(?m)^Cohort, new session\s+CPU per paced chunk \S+ = [\d.]+ × the bare relay hop`,
		`(?m)^BenchmarkE2E/paced_cpu_per_chunk/floor_relay 1 [1-9]\d* ns/op$`, `(?m)^BenchmarkE2E/paced_cpu_per_chunk/floor_sse 1 [1-9]\d* ns/op$`,
		`(?m)^Cohort, new session\s+largest N at the bar: \d+`, `(?m)^floor: bare SSE relay hop\s+largest N at the bar: \d+`,
		`(?m)^BenchmarkE2E/paced_cpu_per_chunk/cohort 1 [1-9]\d* ns/op$`, `(?m)^BenchmarkE2E/paced_cpu_per_chunk/model 1 [1-9]\d* ns/op$`,
		`(?m)^BenchmarkE2E/ttfc_p50/cohort_continued 1 [1-9]\d* ns/op$`, `(?m)^BenchmarkE2E/ttfc_p50/model 1 [1-9]\d* ns/op$`} {
		if !regexp.MustCompile(re).MatchString(o) {
			t.Errorf("output lacks %s:\n%s", re, o)
		}
	}
}

// TestBenchE2ERefusesUnknownProvisioner: a mistyped --provisioner is an
// error before any process starts.
func TestBenchE2ERefusesUnknownProvisioner(t *testing.T) {
	var out, errs strings.Builder
	err := benchE2E(context.Background(), []string{"--provisioner", "jail"}, &out, &errs)
	if err == nil || !strings.Contains(err.Error(), "--provisioner must be local, gvisor or remote") || out.Len() != 0 {
		t.Fatalf("err %v, output %q", err, out.String())
	}
}
