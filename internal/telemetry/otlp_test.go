package telemetry

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The exporter posts what the SDK's own OTLP exporter would: one
// ResourceSpans per resource and scope, with ids, parents, kinds, typed
// attributes, events and status; and reports a collector's refusal.
func TestOTLPExporter(t *testing.T) {
	var got []*tracepb.ResourceSpans
	var headers http.Header
	status := http.StatusOK
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		headers = r.Header.Clone()
		b, _ := io.ReadAll(r.Body)
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 || num != 1 || typ != protowire.BytesType {
				t.Errorf("field %d type %d", num, typ)
				return
			}
			m, k := protowire.ConsumeBytes(b[n:])
			b = b[n+k:]
			rs := &tracepb.ResourceSpans{}
			if err := proto.Unmarshal(m, rs); err != nil {
				t.Error(err)
			}
			got = append(got, rs)
		}
		w.WriteHeader(status)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.URL+"/v1/traces")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=k1")

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, parent := tp.Tracer("cohort-test").Start(context.Background(), "parent", trace.WithSpanKind(trace.SpanKindServer))
	_, child := tp.Tracer("cohort-test").Start(ctx, "child", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("s", "v"), attribute.Int("i", 7), attribute.Bool("b", true), attribute.StringSlice("l", []string{"x", "y"})))
	child.AddEvent("retry", trace.WithAttributes(attribute.Float64("f", 1.5)))
	child.SetStatus(codes.Error, "refused")
	child.End()
	parent.End()

	e, err := newOTLPExporter()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ExportSpans(context.Background(), rec.Ended()); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].ScopeSpans) != 1 || got[0].ScopeSpans[0].Scope.Name != "cohort-test" || len(got[0].ScopeSpans[0].Spans) != 2 {
		t.Fatalf("exported %v", got)
	}
	if headers.Get("Api-Key") != "k1" || headers.Get("Content-Type") != "application/x-protobuf" {
		t.Fatalf("headers %v", headers)
	}
	c, p := got[0].ScopeSpans[0].Spans[0], got[0].ScopeSpans[0].Spans[1]
	pid := parent.SpanContext().SpanID()
	if c.Name != "child" || hex.EncodeToString(c.ParentSpanId) != hex.EncodeToString(pid[:]) || c.Kind != tracepb.Span_SPAN_KIND_CLIENT ||
		p.Kind != tracepb.Span_SPAN_KIND_SERVER || len(p.ParentSpanId) != 0 || string(c.TraceId) != string(p.TraceId) {
		t.Fatalf("child %v parent %v", c, p)
	}
	attrs := map[string]*commonpb.AnyValue{}
	for _, kv := range c.Attributes {
		attrs[kv.Key] = kv.Value
	}
	if l := attrs["l"].GetArrayValue().GetValues(); attrs["s"].GetStringValue() != "v" || attrs["i"].GetIntValue() != 7 || !attrs["b"].GetBoolValue() ||
		len(l) != 2 || l[0].GetStringValue() != "x" || l[1].GetStringValue() != "y" || len(attrs) != 4 {
		t.Fatalf("attributes %v", c.Attributes)
	}
	if c.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || c.Status.GetMessage() != "refused" || len(c.Events) != 1 || c.Events[0].Name != "retry" {
		t.Fatalf("status %v events %v", c.Status, c.Events)
	}
	status = http.StatusServiceUnavailable
	if err := e.ExportSpans(context.Background(), rec.Ended()); err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("a refusing collector: %v", err)
	}
}
