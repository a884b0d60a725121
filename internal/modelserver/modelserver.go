// Package modelserver is a scripted model provider for tests: one local
// HTTP server that speaks the streaming APIs third-party agents call
// (OpenAI Chat Completions and Responses, Anthropic Messages, Gemini), and
// answers each request with what the test's script decides from the
// conversation so far. Nothing here reaches a real model.
//
//	m := modelserver.Start(t, func(turn modelserver.Turn) modelserver.Reply {
//		if len(turn.ToolResults) > 0 {
//			return modelserver.Reply{Text: "done: " + turn.ToolResults[0]}
//		}
//		return modelserver.Reply{Calls: []modelserver.Call{{Name: "Bash", Arguments: `{"command":"echo hi"}`}}}
//	})
//	// point the agent at m.URL
package modelserver

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
)

// Protocols, as recorded in Turn.Protocol.
const (
	OpenAIChat      = "openai-chat"
	OpenAIResponses = "openai-responses"
	Anthropic       = "anthropic"
	Gemini          = "gemini"
)

// Turn is one request to the model, reduced to what a script decides on.
type Turn struct {
	Protocol string
	Model    string
	// System is the system prompt or instructions, joined.
	System string
	// User is the text of the last user message.
	User string
	// ToolResults are the outputs of the tool calls answered since the
	// last user message, in order.
	ToolResults []string
	// Tools are the names of the tools the agent offered; a tool in a
	// namespace (Responses API) is "namespace/name", and a Call of that
	// name is sent in the namespace.
	Tools []string
	// Header and Body are the request as received.
	Header http.Header
	Body   []byte
}

// Reply is what the scripted model answers: text, then tool calls.
type Reply struct {
	Text  string
	Calls []Call
	// Usage reported with the answer; zero values are sent as zero.
	InputTokens, OutputTokens int
	// Status, when set, answers with this HTTP status and an error body in
	// the protocol's shape instead of a stream.
	Status int
}

// Call is one tool call the model makes.
type Call struct {
	// ID is the call's id; empty gets a generated one.
	ID   string
	Name string
	// Arguments is a JSON object.
	Arguments string
}

// Script decides the model's reply to a turn.
type Script func(Turn) Reply

// Server is a running scripted model server.
type Server struct {
	// URL is the server's base URL (http://127.0.0.1:port), without a path.
	URL string
	// Addr is its host:port.
	Addr string

	script Script
	srv    *httptest.Server
	mu     sync.Mutex
	turns  []Turn
	seq    int
}

// route is one protocol's handler, registered by the protocol's file.
type route struct {
	pattern string
	handle  func(s *Server, w http.ResponseWriter, r *http.Request)
}

var routes []route

// Start serves script on a loopback port until the test ends. The same
// server answers every protocol, each under the paths its clients use.
func Start(t testing.TB, script Script) *Server {
	t.Helper()
	s := New(script)
	t.Cleanup(s.Close)
	return s
}

// New is Start without a test: Close it when done.
func New(script Script) *Server {
	s := &Server{script: script}
	mux := http.NewServeMux()
	for _, r := range routes {
		mux.HandleFunc(r.pattern, func(w http.ResponseWriter, req *http.Request) { r.handle(s, w, req) })
	}
	s.srv = httptest.NewServer(mux)
	s.URL = s.srv.URL
	s.Addr = s.srv.Listener.Addr().(*net.TCPAddr).String()
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Turns returns the requests answered so far, oldest first.
func (s *Server) Turns() []Turn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Turn(nil), s.turns...)
}

// answer records turn and asks the script for its reply, giving every
// call without an id a unique one.
func (s *Server) answer(turn Turn) Reply {
	s.mu.Lock()
	s.turns = append(s.turns, turn)
	s.mu.Unlock()
	reply := s.script(turn)
	for i := range reply.Calls {
		if reply.Calls[i].ID == "" {
			reply.Calls[i].ID = s.nextID()
		}
		if reply.Calls[i].Arguments == "" {
			reply.Calls[i].Arguments = "{}"
		}
	}
	return reply
}

func (s *Server) nextID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return "call_" + strconv.Itoa(s.seq)
}
