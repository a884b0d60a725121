package launch

import (
	"flag"
	"io"
	"reflect"
	"slices"
	"testing"
	"time"
)

// What a backend encodes is what the daemon decodes, field for field; the
// test fails on a field added to Daemon or Agent and left out of either.
func TestDaemonRoundTrip(t *testing.T) {
	in := Daemon{Listen: "10.0.0.7:7000", ListenFD: 3, SecretFD: 4, DataDir: "/intern", InternID: "i-1", Model: "m-1",
		GatewayURL: "http://127.0.0.1:7/api/v1", HTTPToolProxy: "http://127.0.0.1:8", HTTPToolCAFile: "/run/ca.pem",
		LogLevel: "debug", InteractionDeadline: 90 * time.Second, RetainEvents: 7, RetainBytes: 8, MaxPausedRuns: 9,
		MaxPausedPerCaller: 10, SessionIdleTTL: time.Minute, InitTimeout: 2 * time.Second,
		Agent: Agent{Command: "/opt/agent --acp", Name: "codex", Modules: "/opt/modules", BaseURL: "https://api.example/v1",
			KeyPlaceholder: "placeholder", AuthMethod: "api-key"}}
	allSet(t, reflect.ValueOf(in), "Daemon")
	var out Daemon
	fs := flag.NewFlagSet("intern", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out.Flags(fs)
	if err := fs.Parse(in.Args()); err != nil {
		t.Fatal(err)
	}
	if fs.NArg() != 0 || out != in {
		t.Fatalf("decoded %+v (rest %q), want %+v", out, fs.Args(), in)
	}
}

func allSet(t *testing.T, v reflect.Value, path string) {
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() == reflect.Struct {
			allSet(t, f, path+"."+v.Type().Field(i).Name)
			continue
		}
		if f.IsZero() {
			t.Fatalf("%s.%s is not set: the round trip would not cover it", path, v.Type().Field(i).Name)
		}
	}
}

// A zero field is left to the daemon's default; the intern's id and model
// are passed even empty, so an empty model is not the environment's.
func TestDaemonZeroArgs(t *testing.T) {
	if got, want := (Daemon{}).Args(), []string{"--intern-id", "", "--model", ""}; !slices.Equal(got, want) {
		t.Fatalf("zero Daemon encodes as %q, want %q", got, want)
	}
	t.Setenv("COHORT_MODEL", "from-env")
	var out Daemon
	fs := flag.NewFlagSet("intern", flag.ContinueOnError)
	out.Flags(fs)
	if err := fs.Parse((Daemon{InternID: "i"}).Args()); err != nil || out.Model != "" {
		t.Fatalf("model %q (%v), want none", out.Model, err)
	}
}
