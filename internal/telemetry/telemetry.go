// Package telemetry sets up OpenTelemetry tracing from the standard OTEL_*
// variables: off unless an OTLP endpoint is set. Spans carry routes,
// methods, statuses and ids, never keys, secrets, prompts or content.
package telemetry

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Enabled reports whether the environment asks for traces: an OTLP
// endpoint is set, and neither OTEL_SDK_DISABLED nor OTEL_TRACES_EXPORTER
// turns them off.
func Enabled() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Start installs the global tracer provider and the W3C propagator for a
// process named service (OTEL_SERVICE_NAME wins), exporting over OTLP/HTTP
// as the variables say. It returns the function that flushes and stops
// it; when tracing is off both are no-ops.
func Start(ctx context.Context, service string) (func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	if p := os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "http/protobuf" {
		return nil, errors.New("OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is supported, not " + p)
	}
	exp, err := newOTLPExporter()
	if err != nil {
		return nil, err
	}
	name := os.Getenv("OTEL_SERVICE_NAME")
	if name == "" {
		name = service
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(name)))
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// Tracer is Cohort's tracer (a no-op until Start enables tracing).
func Tracer() trace.Tracer { return otel.Tracer("github.com/cohort-dev/cohort") }

// Inject writes ctx's trace context into m (ACP _meta: traceparent,
// tracestate), as the ACP spec reserves those keys.
func Inject(ctx context.Context, m map[string]any) {
	c := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, c)
	for k, v := range c {
		m[k] = v
	}
}

// Extract reads a trace context from ACP _meta.
func Extract(ctx context.Context, m map[string]any) context.Context {
	c := propagation.MapCarrier{}
	for _, k := range []string{"traceparent", "tracestate"} {
		if v, ok := m[k].(string); ok {
			c[k] = v
		}
	}
	return otel.GetTextMapPropagator().Extract(ctx, c)
}

// Handler traces each request h serves (a server span named by method and
// path, ids folded), continuing the caller's trace; h itself when tracing
// is off, so the hot path pays nothing.
func Handler(h http.Handler) http.Handler {
	if !Enabled() {
		return h
	}
	return otelhttp.NewHandler(h, "", otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
		return r.Method + " " + idSegment.ReplaceAllString(r.URL.Path, "{id}")
	}))
}

// Transport sends the trace context with each request and records a
// client span; rt itself when tracing is off.
func Transport(rt http.RoundTripper) http.RoundTripper {
	if !Enabled() {
		return rt
	}
	return otelhttp.NewTransport(rt)
}

// idSegment is a UUID path segment (interns, workspaces, runs).
var idSegment = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)

// TracesEndpoint is where this process's traces go, as the variables say
// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT
// plus /v1/traces), with the headers the collector wants. A jail's relay
// sends its interns' traces there, so neither enters the jail.
func TracesEndpoint() (string, http.Header) {
	h := http.Header{}
	for _, v := range []string{os.Getenv("OTEL_EXPORTER_OTLP_HEADERS"), os.Getenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS")} {
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) == "" {
				continue
			}
			if dec, err := url.QueryUnescape(strings.TrimSpace(val)); err == nil {
				val = dec
			}
			h.Set(strings.TrimSpace(k), val)
		}
	}
	if e := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); e != "" {
		return e, h
	}
	if e := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); e != "" {
		return strings.TrimSuffix(e, "/") + "/v1/traces", h
	}
	return "", h
}

// JailEnv is the tracing configuration a jailed daemon gets: its traces go
// to the jail's relay at addr; the batching and sampling settings pass on.
func JailEnv(addr string) []string {
	env := []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://" + addr + "/v1/traces", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"}
	for _, k := range []string{"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}
