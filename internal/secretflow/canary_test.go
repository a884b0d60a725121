package secretflow_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/builtinagent"
	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
	"github.com/cohort-dev/cohort/internal/httptool"
	"github.com/cohort-dev/cohort/internal/internd"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/provision/remote"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// TestMain lets the test binary run the built-in agent (the daemon starts
// it as its ACP agent), configured by its COHORT_AGENT_* environment.
func TestMain(m *testing.M) {
	if os.Getenv("SECRETFLOW_AGENT") == "raw" {
		runRawAgent()
	}
	if os.Getenv("SECRETFLOW_AGENT") == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
		err := builtinagent.Serve(ctx, builtinagent.Config{Model: os.Getenv("COHORT_AGENT_MODEL"), BaseURL: os.Getenv("COHORT_AGENT_BASE_URL"),
			APIKey: "model-key", StateDir: os.Getenv("COHORT_AGENT_STATE_DIR"), Logger: log, Version: "test"}, os.Stdin, os.Stdout)
		if err != nil && err != context.Canceled {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const model = "scripted/model"

// boundHost stands in for api.example.com (its certificate covers
// *.example.com) and records every request it receives.
type boundHost struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string
}

func newBoundHost(t *testing.T) *boundHost { return newBoundHostTB(t) }

func newBoundHostTB(t testing.TB) *boundHost {
	h := &boundHost{}
	h.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.seen = append(h.seen, fmt.Sprintf("%s %s auth=%s body=%s", r.Method, r.Host, r.Header.Get("Authorization"), b))
		h.mu.Unlock()
		// The API echoes the credential back, in a header and the body.
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		fmt.Fprintf(w, `{"you_sent":%q,"body":%q}`, r.Header.Get("Authorization"), b)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *boundHost) port() string {
	a := h.srv.Listener.Addr().String()
	return a[strings.LastIndexByte(a, ':')+1:]
}

func (h *boundHost) requests() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen...)
}

type flow struct {
	e        *testenv.Env
	up       *agenttest.Upstream
	host     *boundHost
	daemonLg *testutil.SyncBuffer
	dataDir  string
	daemon   *internd.Daemon
	// agentKind and stop let a test restart the daemon.
	agentKind string
	stop      func()
}

// newFlow wires gateway (real database) → daemon (in process, registered
// like a remote daemon) → built-in agent (subprocess) → scripted model.
func newFlow(t *testing.T, db *bun.DB, steps ...agenttest.Step) *flow {
	t.Helper()
	return newFlowWith(t, db, "1", steps...)
}

// newFlowWith runs the agent kind given ("1": Cohort's built-in agent,
// "raw": a third-party agent).
func newFlowWith(t *testing.T, db *bun.DB, agentKind string, steps ...agenttest.Step) *flow {
	t.Helper()
	e := testenv.New(t, db)
	f := &flow{e: e, up: agenttest.NewUpstream(t, steps...), host: newBoundHost(t), daemonLg: &testutil.SyncBuffer{}, dataDir: t.TempDir()}
	f.agentKind = agentKind
	f.startDaemon(t)
	return f
}

// startDaemon starts (or restarts) the intern's daemon on the flow's data
// directory and registers it with the gateway.
func (f *flow) startDaemon(t *testing.T) {
	t.Helper()
	e, agentKind := f.e, f.agentKind
	if f.stop != nil {
		f.stop()
	}
	const daemonSecret = "daemon-secret-0123456789abcdef0123456789"
	d, err := internd.New(internd.Config{InternID: e.InternID, Secret: daemonSecret, DataDir: f.dataDir,
		AgentCommand: []string{os.Args[0], "-test.run=^$"},
		AgentEnv:     []string{"SECRETFLOW_AGENT=" + agentKind, "COHORT_AGENT_BASE_URL=" + f.up.BaseURL()},
		Model:        model, GatewayURL: e.URL, InitTimeout: 20 * time.Second,
		HTTPTool: httptool.Options{ExtraRoots: []*x509.Certificate{f.host.srv.Certificate()},
			// Test-only: api.example.com is the loopback stand-in.
			AllowLoopback: true, Resolve: func(string) string { return "127.0.0.1" }},
		Log: slog.New(slog.NewJSONHandler(f.daemonLg, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := testutil.ServeH2C(t, d.Handler())
	f.stop = func() {
		srv.Close()
		d.Close()
	}
	t.Cleanup(func() { f.stop() })
	f.daemon = d
	prov := &provision.Provisioner{DB: e.DB, KEK: e.Server.KEK, Backend: &remote.Backend{}}
	if _, err := e.DB.NewUpdate().Model((*store.Intern)(nil)).Set("state = ?", store.InternProvisioning).Where("id = ?", e.InternID).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Register(context.Background(), prov, e.InternID, srv.URL, daemonSecret); err != nil {
		t.Fatal(err)
	}
	e.Server.Chat.Daemons = prov
}

func (f *flow) callArgs(path string) string {
	b, _ := json.Marshal(map[string]any{"method": "POST", "url": "https://api.example.com:" + f.host.port() + path,
		"headers": map[string]string{"Authorization": "Bearer {{secret:api_key}}"}, "body": `{"token":"{{secret:api_key}}"}`})
	return string(b)
}

func (f *flow) chat(t *testing.T, body string) string {
	t.Helper()
	st, out, _ := f.e.Do(t, "POST", "/interns/"+f.e.InternID+"/chat/completions", f.e.WorkspaceKey, "application/json", body)
	if st != 200 {
		t.Fatalf("chat: %d %s", st, out)
	}
	return out
}

func userBody(mode, prompt string) string {
	return fmt.Sprintf(`{"stream":true,"approval_mode":%q,"messages":[{"role":"user","content":%q}]}`, mode, prompt)
}

// everything gathers every place the value must not be: the model's
// inputs, the chat streams, the gateway's and the daemon's (and through it
// the agent's) logs, the audit rows, and every file the daemon and agent
// wrote (sessions, agent state).
func (f *flow) everything(t *testing.T, streams ...string) map[string]string {
	t.Helper()
	reqs, _ := json.Marshal(f.up.Requests())
	var audit []store.VaultRelease
	if err := f.e.DB.NewSelect().Model(&audit).Scan(context.Background()); err != nil {
		t.Fatal(err)
	}
	auditJSON, _ := json.Marshal(audit)
	var files strings.Builder
	filepath.WalkDir(f.dataDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			files.Write(b)
		}
		return nil
	})
	return map[string]string{"model requests": string(reqs), "chat streams": strings.Join(streams, "\n"),
		"gateway log": f.e.Logs(), "daemon and agent log": f.daemonLg.String(), "audit": string(auditJSON), "daemon files": files.String()}
}

// TestCanarySecretReachesOnlyItsHost sends a unique secret through every
// path and proves it appears nowhere but in the request that reached its
// bound host.
func TestCanarySecretReachesOnlyItsHost(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		canary := fmt.Sprintf("canary-%d-Zq9/+=&\"<x>", time.Now().UnixNano())
		f := newFlow(t, db)
		f.up.Push(
			// Turn 1 (self-drive): the request runs at once.
			agenttest.Call(model, "call_1", "http_request", f.callArgs("/v1/things")),
			agenttest.Answer(model, 10, 5, "Done."),
			// Turn 2: a host the secret is not bound to is refused.
			agenttest.Call(model, "call_2", "http_request", strings.Replace(f.callArgs("/x"), "api.example.com", "example.com", 1)),
			agenttest.Answer(model, 10, 5, "Refused."),
			// Turn 3 (manual): the caller approves first.
			agenttest.Call(model, "call_3", "http_request", f.callArgs("/v1/manual")),
			agenttest.Answer(model, 10, 5, "Approved and done."),
		)
		b, _ := json.Marshal(map[string]any{"hosts": []string{"api.example.com"}, "value": canary})
		if st, body, _ := f.e.Do(t, "PUT", "/vault/interns/"+f.e.InternID+"/secrets/api_key", f.e.WorkspaceKey, "application/json", string(b)); st != 201 {
			t.Fatalf("put: %d %s", st, body)
		}

		s1 := f.chat(t, userBody("self-drive", "call the API"))
		if !strings.Contains(s1, "Done.") {
			t.Fatalf("turn 1: %s", s1)
		}
		sid := sessionID(t, s1)
		s2 := f.chat(t, fmt.Sprintf(`{"stream":true,"approval_mode":"self-drive","session_id":%q,"messages":[{"role":"user","content":"again"}]}`, sid))
		s3 := f.chat(t, fmt.Sprintf(`{"stream":true,"approval_mode":"manual","session_id":%q,"messages":[{"role":"user","content":"once more"}]}`, sid))
		iaID, op := interaction(t, s3)
		if op != "http_request" {
			t.Fatalf("manual mode: operation %q in %s", op, s3)
		}
		if n := len(f.host.requests()); n != 1 {
			t.Fatalf("a request went out before approval: %d", n)
		}
		a, _ := json.Marshal(iaID)
		s4 := f.chat(t, fmt.Sprintf(`{"stream":true,"session_id":%q,"messages":[{"role":"user","content":"once more"},`+
			`{"role":"assistant","content":null,"tool_calls":[{"id":%s,"type":"function","function":{"name":"service.provide_input","arguments":"{}"}}]},`+
			`{"role":"tool","tool_call_id":%s,"content":"allow_once"}]}`, sid, a, a))
		if !strings.Contains(s4, "Approved and done.") {
			t.Fatalf("turn 3 after approval: %s", s4)
		}

		// The bound host got the value, twice (turns 1 and 3), in the header and the body.
		got := f.host.requests()
		if len(got) != 2 {
			t.Fatalf("bound host requests: %q", got)
		}
		for _, r := range got {
			if !strings.Contains(r, "auth=Bearer "+canary) || !strings.Contains(r, `body={"token":"`+canary+`"}`) {
				t.Fatalf("bound host did not receive the value: %q", r)
			}
		}
		// The model saw the placeholder in the echo, the refusal message, never the value.
		reqs, _ := json.Marshal(f.up.Requests())
		if !strings.Contains(string(reqs), `you_sent`) || !strings.Contains(string(reqs), `Bearer {{secret:api_key}}`) ||
			!strings.Contains(string(reqs), `not bound to host \\\"example.com\\\"`) {
			t.Fatalf("the model's inputs lack the redacted echo or the refusal: %s", reqs)
		}
		for where, text := range f.everything(t, s1, s2, s3, s4) {
			for _, form := range []string{canary, strings.ReplaceAll(canary, `"`, `\"`), "canary-" + canary[7:20]} {
				if strings.Contains(text, form) {
					t.Fatalf("the secret leaked into %s: %s", where, text)
				}
			}
		}
		// The audit has every decision with its run, and no value.
		var audit []store.VaultRelease
		f.e.DB.NewSelect().Model(&audit).Order("created_at").Scan(context.Background())
		if len(audit) != 3 || audit[0].Outcome != "released" || audit[1].Reason != "host_not_allowed" || audit[2].Outcome != "released" ||
			audit[0].RunID == nil || audit[0].Actor != "daemon:"+f.e.InternID || *audit[0].RunID == *audit[2].RunID {
			t.Fatalf("audit: %+v", audit)
		}
	})
}

func sessionID(t *testing.T, stream string) string {
	t.Helper()
	for _, line := range strings.Split(stream, "\n") {
		var c struct {
			SessionID string `json:"session_id"`
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok && json.Unmarshal([]byte(d), &c) == nil && c.SessionID != "" {
			return c.SessionID
		}
	}
	t.Fatalf("no session_id in %s", stream)
	return ""
}

// interaction returns the pending interaction's id and operation.
func interaction(t *testing.T, stream string) (string, string) {
	t.Helper()
	for _, line := range strings.Split(stream, "\n") {
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok || !strings.Contains(d, "tool_calls") {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						ID       string `json:"id"`
						Function struct {
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(d), &c) != nil || len(c.Choices) == 0 || len(c.Choices[0].Delta.ToolCalls) == 0 {
			continue
		}
		tc := c.Choices[0].Delta.ToolCalls[0]
		var args struct {
			Operation string `json:"operation"`
		}
		json.Unmarshal([]byte(tc.Function.Arguments), &args)
		return tc.ID, args.Operation
	}
	t.Fatalf("no interaction in %s", stream)
	return "", ""
}
