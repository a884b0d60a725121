package e2e_test

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
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
		var ex coltracepb.ExportTraceServiceRequest
		if req.URL.Path != "/v1/traces" || proto.Unmarshal(b, &ex) != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, rs := range ex.GetResourceSpans() {
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
	eventually(t, "the demo intern answers", func() bool {
		res := chat(t, gw, c.WK, c.Demo, user(prompt))
		if res.StatusCode != 200 {
			res.Body.Close()
			return false
		}
		return readAll(t, res).Finish == "stop"
	})

	var chain []span
	eventually(t, "one trace from the gateway to the agent", func() bool {
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
