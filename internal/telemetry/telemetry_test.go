package telemetry

import (
	"strings"
	"testing"
)

// Tracing is off unless an endpoint is set, and off again when the
// standard variables say so; the traces endpoint and the collector's
// headers come from the standard variables.
func TestEnvironment(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER",
		"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_BSP_SCHEDULE_DELAY"} {
		t.Setenv(k, "")
	}
	if Enabled() {
		t.Fatal("enabled without an endpoint")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b, x-tenant = t1,broken")
	if !Enabled() {
		t.Fatal("not enabled with an endpoint")
	}
	url, h := TracesEndpoint()
	if url != "http://collector:4318/v1/traces" || h.Get("Api-Key") != "a b" || h.Get("X-Tenant") != "t1" || len(h) != 2 {
		t.Fatalf("endpoint %q headers %v", url, h)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://traces.example/v1/t")
	if url, _ := TracesEndpoint(); url != "https://traces.example/v1/t" {
		t.Fatalf("traces endpoint %q", url)
	}
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	env := strings.Join(JailEnv("127.0.0.1:7104"), " ")
	if env != "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:7104/v1/traces OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf OTEL_BSP_SCHEDULE_DELAY=50" ||
		strings.Contains(env, "a%20b") {
		t.Fatalf("jail env %s", env)
	}
	for _, off := range [][2]string{{"OTEL_SDK_DISABLED", "true"}, {"OTEL_TRACES_EXPORTER", "none"}} {
		t.Setenv(off[0], off[1])
		if Enabled() {
			t.Fatalf("enabled with %s=%s", off[0], off[1])
		}
		t.Setenv(off[0], "")
	}
}
