package builtinagent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// writeCounter counts the writes of the connections it dialled.
type writeCounter struct {
	net.Conn
	n *atomic.Int32
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// TestModelRequestOneWrite: the agent's model request goes out in one
// write, its headers with its body; through openai-go as is, the headers
// were flushed on their own first.
func TestModelRequestOneWrite(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer up.Close()
	var writes atomic.Int32
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		return writeCounter{c, &writes}, err
	}}
	m := NewOpenAIModel(OpenAIConfig{BaseURL: up.URL, APIKey: "k", HTTPClient: &http.Client{Transport: tr}})
	for i := range 3 {
		writes.Store(0)
		var got string
		_, err := m.Complete(context.Background(), ModelRequest{Model: "m", Messages: []Message{{Role: "user", Content: fmt.Sprintf("hello %d", i)}}},
			func(d Delta) error { got += d.Text; return nil })
		if err != nil || got != "hi" {
			t.Fatalf("turn %d: %q %v", i, got, err)
		}
		if n := writes.Load(); n != 1 {
			t.Fatalf("turn %d: the request took %d writes, want 1", i, n)
		}
	}
}
