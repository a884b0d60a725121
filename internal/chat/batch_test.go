package chat_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	interndv1 "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/gen/cohort/internd/v1/interndv1connect"
	"github.com/cohort-dev/cohort/internal/lookahead"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// burstDaemon answers StartTurn with all of evs in one HTTP/2 write, as
// Connect frames them (flags byte, big-endian length, message), then the
// end-of-stream frame: the gateway finds the whole turn waiting at once.
func burstDaemon(t *testing.T, evs ...*interndv1.RunEvent) interndv1connect.InternDaemonServiceClient {
	return holdingDaemon(t, nil, nil, evs...)
}

// holdingDaemon is burstDaemon that, when hold is not nil, flushes the
// events and then waits for hold to be closed before it ends the stream;
// released then says whether hold was closed (false: the gateway ended the
// call first).
func holdingDaemon(t *testing.T, hold <-chan struct{}, released chan<- bool, evs ...*interndv1.RunEvent) interndv1connect.InternDaemonServiceClient {
	frame := func(b []byte, flags byte, msg []byte) []byte {
		b = append(b, flags)
		b = binary.BigEndian.AppendUint32(b, uint32(len(msg)))
		return append(b, msg...)
	}
	var body []byte
	for _, ev := range evs {
		b, err := proto.Marshal(&interndv1.StartTurnResponse{Event: ev})
		if err != nil {
			t.Fatal(err)
		}
		body = frame(body, 0, b)
	}
	end := frame(nil, 2, []byte("{}"))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/connect+proto")
		w.WriteHeader(200)
		if hold == nil {
			w.Write(append(body, end...))
			return
		}
		w.Write(body)
		w.(http.Flusher).Flush()
		select {
		case <-hold:
			released <- true
		case <-r.Context().Done():
			released <- false
		}
		w.Write(end)
	}))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)
	return interndv1connect.NewInternDaemonServiceClient(&http.Client{Transport: lookahead.Transport{RoundTripper: &http.Transport{Protocols: &p}}}, srv.URL)
}

// countingListener counts the writes on the connections it accepts.
type countingListener struct {
	net.Listener
	writes *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return countingConn{c, l.writes}, err
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestBurstLeavesInOneWrite: events that reach the gateway together leave
// together. A whole turn that arrives in one read (role, three deltas,
// usage, stop) is one write to the caller: headers, every chunk, [DONE]
// and the end of the chunked body.
func TestBurstLeavesInOneWrite(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))
	e.Server.Chat.Daemons = daemons{d: &daemon{client: burstDaemon(t,
		started("sess-1"), textEv(model, "one "), textEv(model, "two "), textEv(model, "three"),
		usageEv(model, &interndv1.Usage{PromptTokens: 1, CompletionTokens: 3, TotalTokens: 4}), stopEv(model))}}
	var writes atomic.Int64
	hs := httptest.NewUnstartedServer(e.Server.Handler())
	hs.Listener = countingListener{hs.Listener, &writes}
	hs.Start()
	t.Cleanup(hs.Close)

	req, _ := http.NewRequest("POST", hs.URL+server.Prefix+"/interns/"+e.InternID+"/chat/completions", strings.NewReader(userBody("x")))
	req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("%d %v\n%s", res.StatusCode, err, raw)
	}
	chunks, _ := parseStream(t, string(raw))
	var text strings.Builder
	for _, c := range chunks {
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				text.WriteString(*ch.Delta.Content)
			}
		}
	}
	if text.String() != "one two three" || finishOf(chunks) != "stop" || len(chunks) != 6 {
		t.Fatalf("stream: %d chunks, text %q, finish %q:\n%s", len(chunks), text.String(), finishOf(chunks), raw)
	}
	if n := writes.Load(); n != 1 {
		t.Errorf("the response took %d writes, want 1", n)
	}
}

// TestNothingHeldBack: the lookahead only takes what has already arrived.
// A chunk followed by an event that makes no chunk (usage) and then
// silence goes out at once: the daemon waits for the caller to see it
// before it sends the rest.
func TestNothingHeldBack(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))
	seen := make(chan struct{})
	held := make(chan bool, 1)
	e.d.set(func(ctx context.Context, send func(*interndv1.RunEvent) error) error {
		send(started("sess-1"))
		send(textEv(model, "first"))
		send(usageEv(model, &interndv1.Usage{PromptTokens: 1, CompletionTokens: 1, TotalTokens: 2}))
		select {
		case <-seen:
			held <- false
		case <-time.After(5 * time.Second):
			held <- true
		case <-ctx.Done():
			return ctx.Err()
		}
		send(textEv(model, "second"))
		return send(stopEv(model))
	}, nil)
	all := streamUntil(t, e, userBody("x"), `"content":"first"`, seen)
	if <-held {
		t.Fatalf("the first chunk waited for the daemon's next event:\n%s", all)
	}
	if !strings.Contains(all, `"content":"second"`) || !strings.HasSuffix(all, "data: [DONE]\n\n") {
		t.Errorf("stream did not finish:\n%s", all)
	}
}

// TestPauseNotHeldByTheDrain: after Finished the gateway waits for the
// daemon to close its stream before the finish chunk (a caller leaving
// after [DONE] must not look like one leaving mid-run), but the chunks
// that came before Finished, here the tool call, do not wait for it even
// when they arrived together with Finished.
func TestPauseNotHeldByTheDrain(t *testing.T) {
	e := newEnv(t, storetest.SQLite(t))
	seen := make(chan struct{})
	released := make(chan bool, 1)
	e.Server.Chat.Daemons = daemons{d: &daemon{client: holdingDaemon(t, seen, released,
		started("sess-1"), textEv(model, "I will list the files."), permissionEv(model, "int-1", ptr("shell")),
		finishedEv(model, &interndv1.Finished{Reason: interndv1.Finished_REASON_PAUSED}))}}
	all := streamUntil(t, e, userBody("$ ls", `,"approval_mode":"manual"`), `"service.provide_input"`, seen)
	// Held, the tool call would have reached us only once the gateway gave
	// up waiting for the close (5 s) and ended the daemon call itself.
	if !<-released {
		t.Fatalf("the tool call waited for the daemon to close its stream:\n%s", all)
	}
	chunks, _ := parseStream(t, all)
	if finishOf(chunks) != "tool_calls" || !strings.HasSuffix(all, "data: [DONE]\n\n") {
		t.Errorf("stream:\n%s", all)
	}
}

// streamUntil posts body to the demo intern with the workspace key and
// reads the whole stream as it arrives, closing seen at the first line
// that contains mark (the daemon's script waits for that).
func streamUntil(t *testing.T, e *env, body, mark string, seen chan struct{}) string {
	t.Helper()
	req, _ := http.NewRequest("POST", e.URL+"/interns/"+e.InternID+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
	res, err := e.HTTPClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var all strings.Builder
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		all.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), mark) {
			select {
			case <-seen:
			default:
				close(seen)
			}
		}
	}
	return all.String()
}
