package e2e_test

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// span is what the test keeps of an exported span.
type span struct {
	service, name, trace, id, parent string
	values                           []string // every attribute value
}

// traceReceiver is an OTLP/HTTP collector: it keeps every span posted to
// /v1/traces.
type traceReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []span
}

func newTraceReceiver(t *testing.T) *traceReceiver {
	r := &traceReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		all, err := resourceSpans(b)
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, rs := range all {
			service := ""
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					sp := span{service: service, name: s.GetName(), trace: hex.EncodeToString(s.GetTraceId()),
						id: hex.EncodeToString(s.GetSpanId()), parent: hex.EncodeToString(s.GetParentSpanId())}
					for _, a := range s.GetAttributes() {
						sp.values = append(sp.values, a.GetValue().String())
					}
					r.spans = append(r.spans, sp)
				}
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(nil)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// resourceSpans decodes an ExportTraceServiceRequest (field 1: repeated
// ResourceSpans) without the collector package and its gRPC stubs.
func resourceSpans(b []byte) ([]*tracepb.ResourceSpans, error) {
	var out []*tracepb.ResourceSpans
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			return nil, fmt.Errorf("unexpected field %d", num)
		}
		m, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		rs := &tracepb.ResourceSpans{}
		if err := proto.Unmarshal(m, rs); err != nil {
			return nil, err
		}
		out = append(out, rs)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no spans")
	}
	return out, nil
}

func (r *traceReceiver) all() []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]span(nil), r.spans...)
}

// One chat turn is one trace across the three processes: the gateway's
// request, its call to the daemon, the daemon's agent turn and the
// built-in agent's prompt, each the child of the one before. The jailed
// daemon and agent export through their jail's relay. No attribute holds
// the caller's key or the prompt.
func TestOneTraceSpansGatewayDaemonAndAgent(t *testing.T) {
	t.Parallel()
	rec := newTraceReceiver(t)
	dataDir := t.TempDir()
	c := &cluster{dataDir: dataDir, dbArgs: []string{"--data-dir", dataDir}}
	gw := c.GatewayEnv(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rec.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=50"}, "--provisioner", "local")
	c.load(t)
	prompt := "hello " + randomCanary("prompt")
	testutil.Eventually(t, wait, "the demo intern answers", func() bool {
		res := chat(t, gw, c.WK, c.Demo, user(prompt))
		if res.StatusCode != 200 {
			res.Body.Close()
			return false
		}
		return readAll(t, res).Finish == "stop"
	})

	var chain []span
	testutil.Eventually(t, wait, "one trace from the gateway to the agent", func() bool {
		spans := rec.all()
		byID := map[string]span{}
		for _, s := range spans {
			byID[s.id] = s
		}
		for _, s := range spans {
			if s.service != "cohort-agent" || s.name != "agent prompt" {
				continue
			}
			chain = []span{s}
			for p := s; p.parent != "" && byID[p.parent].id != ""; {
				p = byID[p.parent]
				chain = append(chain, p)
			}
			if top := chain[len(chain)-1]; top.service == "cohort-gateway" && top.parent == "" {
				return true
			}
		}
		return false
	})
	var path []string
	for i := len(chain) - 1; i >= 0; i-- {
		path = append(path, chain[i].service+": "+chain[i].name)
		if chain[i].trace != chain[0].trace {
			t.Fatalf("span %s of another trace", chain[i].name)
		}
	}
	got := strings.Join(path, " > ")
	want := "cohort-gateway: POST /api/v1/interns/{id}/chat/completions > cohort-gateway: HTTP POST > " +
		"cohort-intern: POST /cohort.internd.v1.InternDaemonService/StartTurn > cohort-intern: agent turn > cohort-agent: agent prompt"
	if got != want {
		t.Fatalf("the trace is\n  %s\nwant\n  %s", got, want)
	}
	for _, s := range rec.all() {
		for _, v := range s.values {
			if strings.Contains(v, c.WK) || strings.Contains(v, prompt) {
				t.Fatalf("span %s %s carries the key or the prompt: %s", s.service, s.name, v)
			}
		}
	}
}
