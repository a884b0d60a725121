package localjail

import (
	"slices"
	"testing"
)

// An unjailed daemon gets the agents' allowlist and its own tracing
// settings, nothing else of the gateway's environment.
func TestDaemonEnviron(t *testing.T) {
	got := daemonEnviron([]string{"PATH=/bin", "AWS_SECRET_ACCESS_KEY=s", "FOO_TOKEN=t", "COHORT_DATABASE_URL=postgres://",
		"COHORT_AGENT_API_KEY=k", "OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_EXPORTER_OTLP_HEADERS=a=b"})
	want := []string{"PATH=/bin", "COHORT_AGENT_API_KEY=k", "OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_EXPORTER_OTLP_HEADERS=a=b"}
	if !slices.Equal(got, want) {
		t.Fatalf("daemonEnviron:\n got %q\nwant %q", got, want)
	}
}
