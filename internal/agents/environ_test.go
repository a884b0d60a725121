package agents

import (
	"slices"
	"testing"
)

func TestEnviron(t *testing.T) {
	in := []string{"PATH=/bin", "HOME=/h", "LC_ALL=C", "HTTPS_PROXY=http://p:3128", "SSL_CERT_FILE=/ca.pem",
		"COHORT_AGENT_MODEL=m", "COHORT_CPUPROFILE=/tmp/p",
		"AWS_SECRET_ACCESS_KEY=s", "GITHUB_TOKEN=t", "COHORT_INTERN_SECRET=x", "COHORT_DATABASE_URL=postgres://",
		"OTEL_EXPORTER_OTLP_HEADERS=a=b", "OTEL_EXPORTER_OTLP_TRACES_HEADERS=a=b", "OTEL_EXPORTER_OTLP_ENDPOINT=http://c", "LD_PRELOAD=/evil.so", "NODE_OPTIONS=--require /evil.js",
		"OPENAI_API_KEY=sk-1", "OPENAI_BASE_URL=http://m/v1", "COHORT_AGENT_BASE_URL=http://mine/v1"}
	got := Environ(in)
	want := []string{"PATH=/bin", "HOME=/h", "LC_ALL=C", "HTTPS_PROXY=http://p:3128", "SSL_CERT_FILE=/ca.pem",
		"COHORT_AGENT_MODEL=m", "COHORT_CPUPROFILE=/tmp/p", "OTEL_EXPORTER_OTLP_ENDPOINT=http://c", "COHORT_AGENT_BASE_URL=http://mine/v1",
		// OPENAI_API_KEY passes under its twin's name; OPENAI_BASE_URL
		// does not, its twin being set.
		"COHORT_AGENT_API_KEY=sk-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("Environ:\n got %q\nwant %q", got, want)
	}
}
