package internd

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	acp "github.com/coder/acp-go-sdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/httptool"
	"github.com/cohort-dev/cohort/internal/internd/launch"
)

// MCPServerName is the name of the daemon's MCP server in session/new.
const MCPServerName = "cohort"

// tools is the daemon's MCP server: the http_request tool, served on
// loopback over the streamable HTTP transport to whatever ACP agent the
// intern runs (ours included), so secrets reach requests the same way for
// every agent and never enter the agent's process. Each ACP session gets
// its own bearer credential, which names the session (and so the run, its
// approval mode and the audit's run id) the call belongs to.
type tools struct {
	d    *Daemon
	tool *httptool.Tool
	ln   net.Listener
	srv  *http.Server
	url  string
	gw   cohortv1connect.InternGatewayServiceClient

	mu      sync.Mutex
	byToken map[[32]byte]*toolBinding
}

// toolBinding ties a credential to a daemon session. Its MCP server is
// built on the session's first MCP request (t.mu): the built-in agent
// connects only when the model calls a tool, and most sessions never do.
type toolBinding struct {
	s       *session
	srv     *mcp.Server
	dropped bool // its credential was replaced or forgotten
}

func (d *Daemon) startTools() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("mcp listener: %w", err)
	}
	t := &tools{d: d, tool: httptool.New(d.cfg.HTTPTool), ln: ln, url: "http://" + ln.Addr().String() + "/mcp",
		byToken: map[[32]byte]*toolBinding{}}
	if d.cfg.GatewayURL != "" {
		t.gw = cohortv1connect.NewInternGatewayServiceClient(http.DefaultClient, strings.TrimSuffix(d.cfg.GatewayURL, "/"),
			connect.WithInterceptors(bearer("Bearer "+launch.DaemonCredential(d.cfg.Secret))))
	}
	h := mcp.NewStreamableHTTPHandler(t.server, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	t.srv = &http.Server{Handler: t.auth(h), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	go t.srv.Serve(ln)
	d.tools = t
	return nil
}

func (t *tools) close() {
	if t != nil {
		t.srv.Close()
	}
}

type bindingKey struct{}

// auth admits a request only with a session's credential.
func (t *tools) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		t.mu.Lock()
		b := t.byToken[sha256.Sum256([]byte(tok))]
		t.mu.Unlock()
		if !ok || b == nil {
			http.Error(w, "missing or invalid credential", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), bindingKey{}, b)))
	})
}

// server returns the MCP server of the request's session.
func (t *tools) server(r *http.Request) *mcp.Server {
	b, _ := r.Context().Value(bindingKey{}).(*toolBinding)
	if b == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if b.dropped {
		return nil
	}
	if b.srv == nil {
		b.srv = mcp.NewServer(&mcp.Implementation{Name: "cohort-intern", Version: "1"}, nil)
		b.srv.AddTool(&mcp.Tool{Name: httptool.Name, Description: httptool.Description, InputSchema: httptool.InputSchema}, t.handler(b.s))
	}
	return b.srv
}

// bind issues a fresh credential for a session and returns the MCP server
// entry for session/new or session/load. The session's earlier credential
// stops working.
func (t *tools) bind(s *session) acp.McpServer {
	var raw [32]byte
	rand.Read(raw[:])
	tok := base64.RawURLEncoding.EncodeToString(raw[:])
	t.mu.Lock()
	old := t.dropLocked(s)
	t.byToken[sha256.Sum256([]byte(tok))] = &toolBinding{s: s}
	t.mu.Unlock()
	closeSessions(old)
	return acp.McpServer{Http: &acp.McpServerHttpInline{Type: "http", Name: MCPServerName, Url: t.url,
		Headers: []acp.HttpHeader{{Name: "Authorization", Value: "Bearer " + tok}}}}
}

// unbind forgets a session's tool credential (the session left memory; a
// new bind comes with its next agent session).
func (t *tools) unbind(s *session) {
	if t == nil {
		return
	}
	t.mu.Lock()
	old := t.dropLocked(s)
	t.mu.Unlock()
	closeSessions(old)
}

// dropLocked removes s's bindings and returns their servers. Their MCP
// sessions must be closed by the daemon: the agent's own goodbye (a
// DELETE with the old credential) would no longer be admitted, and the
// handler would keep each session for good.
func (t *tools) dropLocked(s *session) []*mcp.Server {
	var out []*mcp.Server
	for k, b := range t.byToken {
		if b.s == s {
			delete(t.byToken, k)
			b.dropped = true
			if b.srv != nil {
				out = append(out, b.srv)
			}
		}
	}
	return out
}

func closeSessions(servers []*mcp.Server) {
	for _, srv := range servers {
		for ss := range srv.Sessions() {
			ss.Close()
		}
	}
}

func toolError(msg string) *mcp.CallToolResult {
	b, _ := json.Marshal(map[string]string{"error": msg})
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}
}

// handler runs http_request for one session's current run. In manual mode
// a request that would release a secret first asks the caller (a
// permission interaction whose operation is http_request).
func (t *tools) handler(s *session) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args, err := httptool.DecodeArgs(req.Params.Arguments)
		if err != nil {
			return toolError(apierr.From(err).Message), nil
		}
		t.d.mu.Lock()
		var r *run
		if s.busy {
			r = s.current
		}
		t.d.mu.Unlock()
		if r == nil {
			return toolError("no turn of this session is in progress"), nil
		}
		if err := httptool.Check(args); err != nil {
			// Never ask the caller to approve a request that cannot go.
			e := apierr.From(err)
			t.d.log.Info("http_request refused", "run", r.id, "secrets", httptool.SecretNames(args), "status", e.Status, "reason", e.Reason, "message", e.Message)
			return toolError(e.Message), nil
		}
		if len(httptool.SecretNames(args)) > 0 && r.mode == pb.ApprovalMode_APPROVAL_MODE_MANUAL {
			t.d.mu.Lock()
			a := t.d.agent
			t.d.mu.Unlock()
			a.settle()
			kinds := []string{"allow_once", "reject_once"}
			ia := &interaction{kinds: kinds, optionID: map[string]acp.PermissionOptionId{"allow_once": "allow_once", "reject_once": "reject_once"}}
			op := httptool.Name
			rep := r.ask(ctx, ia, &pb.Interaction{Kind: &pb.Interaction_Permission{Permission: &pb.Permission{Operation: &op, Options: kinds}}})
			switch {
			case rep.cancel:
				return toolError("the run was cancelled before the request was approved"), nil
			case rep.optionID != "allow_once":
				return toolError("the user rejected this request: it was not sent"), nil
			}
		}
		res, err := t.tool.Do(ctx, args, func(ctx context.Context, name, host string) (string, error) {
			return t.release(ctx, r.id, name, host)
		})
		if err != nil {
			e := apierr.From(err)
			if e.Bug {
				apierr.LogFault(ctx, t.d.log, e, slog.String("tool", httptool.Name), slog.String("run", r.id))
			}
			if names := httptool.SecretNames(args); len(names) > 0 {
				// A record of every refused request that named secrets,
				// including those refused before the vault was asked (no
				// value is ever in the message).
				t.d.log.Info("http_request refused", "run", r.id, "secrets", names, "status", e.Status, "reason", e.Reason, "message", e.Message)
			}
			return toolError(e.Message), nil
		}
		b, err := json.Marshal(res)
		if err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}, nil
	}
}

// release asks the gateway's vault for a value. The error message is the
// vault's (safe for the model: which secret, which host, why).
func (t *tools) release(ctx context.Context, runID, name, host string) (string, error) {
	if t.gw == nil {
		return "", apierr.New(http.StatusBadGateway, "", "this intern has no vault connection (the daemon was started without a gateway URL)")
	}
	res, err := t.gw.ReleaseSecret(ctx, connect.NewRequest(&cohortv1.ReleaseSecretRequest{InternId: t.d.cfg.InternID, Name: name, Host: host, RunId: runID}))
	if err != nil {
		e := apierr.FromConnect(err)
		if e.Status >= 500 || e.Status == http.StatusUnauthorized {
			t.d.log.Error("vault release failed", "secret", name, "host", host, "status", e.Status, "err", err)
			return "", apierr.New(http.StatusBadGateway, "", "the vault could not be reached or refused this intern; try again later")
		}
		// The vault's refusal: its status, reason and message.
		return "", &apierr.Error{Status: e.Status, Reason: e.Reason, Message: e.Message}
	}
	return res.Msg.GetValue(), nil
}

// bearer adds the daemon's credential to calls to the gateway.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// ToolsURL is the loopback URL of the daemon's MCP server (for operators'
// diagnostics and tests); every request needs a session's credential.
func (d *Daemon) ToolsURL() string { return d.tools.url }
