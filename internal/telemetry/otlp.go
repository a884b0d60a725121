package telemetry

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// otlpExporter sends spans as OTLP/HTTP protobuf, the wire format of the
// SDK's otlptracehttp, which it stands in for: that exporter's gRPC
// dependencies added 33 MB of text to the binary and 4.6 MiB to every
// awake intern, tracing on or off (docs/benchmarks.md as of 233a0f0, "Tracing's cost").
type otlpExporter struct {
	url     string
	headers http.Header
	client  *http.Client
}

func newOTLPExporter() (*otlpExporter, error) {
	url, headers := TracesEndpoint()
	timeout := 10 * time.Second
	if v := os.Getenv("OTEL_EXPORTER_OTLP_TIMEOUT"); v != "" {
		var ms int
		if _, err := fmt.Sscan(v, &ms); err != nil || ms <= 0 {
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_TIMEOUT: %q is not a number of milliseconds", v)
		}
		timeout = time.Duration(ms) * time.Millisecond
	}
	return &otlpExporter{url: url, headers: headers, client: &http.Client{Timeout: timeout}}, nil
}

func (e *otlpExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	body, err := encodeSpans(spans)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, v := range e.headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	res, err := e.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("otlp: the collector answered %s", res.Status)
	}
	return nil
}

func (e *otlpExporter) Shutdown(context.Context) error {
	e.client.CloseIdleConnections()
	return nil
}

// encodeSpans is an ExportTraceServiceRequest: field 1 repeated
// ResourceSpans, one per resource and scope.
func encodeSpans(spans []sdktrace.ReadOnlySpan) ([]byte, error) {
	type key struct {
		res   attribute.Distinct
		scope string
	}
	var order []key
	groups := map[key]*tracepb.ResourceSpans{}
	for _, s := range spans {
		k := key{s.Resource().Equivalent(), s.InstrumentationScope().Name + "\x00" + s.InstrumentationScope().Version}
		rs := groups[k]
		if rs == nil {
			rs = &tracepb.ResourceSpans{Resource: &resourcepb.Resource{Attributes: keyValues(s.Resource().Attributes())},
				ScopeSpans: []*tracepb.ScopeSpans{{Scope: &commonpb.InstrumentationScope{Name: s.InstrumentationScope().Name,
					Version: s.InstrumentationScope().Version}, SchemaUrl: s.InstrumentationScope().SchemaURL}},
				SchemaUrl: s.Resource().SchemaURL()}
			groups[k] = rs
			order = append(order, k)
		}
		rs.ScopeSpans[0].Spans = append(rs.ScopeSpans[0].Spans, span(s))
	}
	var b []byte
	for _, k := range order {
		m, err := proto.Marshal(groups[k])
		if err != nil {
			return nil, err
		}
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	return b, nil
}

func span(s sdktrace.ReadOnlySpan) *tracepb.Span {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	out := &tracepb.Span{TraceId: tid[:], SpanId: sid[:], TraceState: sc.TraceState().String(), Name: s.Name(),
		Kind: tracepb.Span_SpanKind(s.SpanKind()), StartTimeUnixNano: uint64(s.StartTime().UnixNano()),
		EndTimeUnixNano: uint64(s.EndTime().UnixNano()), Attributes: keyValues(s.Attributes()),
		DroppedAttributesCount: uint32(s.DroppedAttributes()), Flags: uint32(sc.TraceFlags())}
	if p := s.Parent(); p.IsValid() {
		psid := p.SpanID()
		out.ParentSpanId = psid[:]
	}
	// The SDK's kinds and OTLP's are numbered alike (1 internal … 5 consumer).
	if s.SpanKind() == trace.SpanKindUnspecified {
		out.Kind = tracepb.Span_SPAN_KIND_INTERNAL
	}
	switch st := s.Status(); st.Code {
	case codes.Error:
		out.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: st.Description}
	case codes.Ok:
		out.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_OK}
	}
	for _, ev := range s.Events() {
		out.Events = append(out.Events, &tracepb.Span_Event{TimeUnixNano: uint64(ev.Time.UnixNano()), Name: ev.Name,
			Attributes: keyValues(ev.Attributes)})
	}
	for _, l := range s.Links() {
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		out.Links = append(out.Links, &tracepb.Span_Link{TraceId: ltid[:], SpanId: lsid[:],
			TraceState: l.SpanContext.TraceState().String(), Attributes: keyValues(l.Attributes)})
	}
	return out
}

func keyValues(kvs []attribute.KeyValue) []*commonpb.KeyValue {
	out := make([]*commonpb.KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, &commonpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return out
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.STRING:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.AsString()}}
	case attribute.BOOLSLICE, attribute.INT64SLICE, attribute.FLOAT64SLICE, attribute.STRINGSLICE:
		var vals []*commonpb.AnyValue
		switch v.Type() {
		case attribute.BOOLSLICE:
			for _, x := range v.AsBoolSlice() {
				vals = append(vals, anyValue(attribute.BoolValue(x)))
			}
		case attribute.INT64SLICE:
			for _, x := range v.AsInt64Slice() {
				vals = append(vals, anyValue(attribute.Int64Value(x)))
			}
		case attribute.FLOAT64SLICE:
			for _, x := range v.AsFloat64Slice() {
				vals = append(vals, anyValue(attribute.Float64Value(x)))
			}
		default:
			for _, x := range v.AsStringSlice() {
				vals = append(vals, anyValue(attribute.StringValue(x)))
			}
		}
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: vals}}}
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.String()}}
}
