// Package acptap reads an ACP agent's stdout ahead of acp-go-sdk: the text
// chunks of session/update notifications are decoded here and handed on in
// order, other session/update kinds are dropped, and every other line (the
// agent's responses and requests) goes on to the SDK unchanged.
//
// It stands beside the SDK for three reasons, measured or observed:
//
//   - CPU. acp-go-sdk's generic decoding of updates was half of the
//     daemon's CPU once Connect's per-message gzip was off; decoding the
//     text chunks here took the daemon from 28,000 to 60,000 events per
//     second (docs/benchmarks.md, "Intern daemon"; with an agent that is
//     not the limit the daemon now carries 192,800 events per second at
//     4.9 µs of CPU per event). Lines in the SDK's own key order, the
//     built-in agent's among them, are read without encoding/json
//     (fast.go).
//   - Order. The SDK runs the agent's requests concurrently with its
//     notification queue, so a permission request could overtake the text
//     sent just before it, and that text would land after the pause.
//   - Flow control. The update callback may block (the daemon blocks while
//     a run's consumer lags a full retention bound behind); the tap then
//     stops reading and the agent waits on its pipe. The SDK would instead
//     close the connection once 1,024 notifications queue up.
//
// Settle covers what the tap alone cannot: a tool call that reaches the
// daemon over another connection than the agent's stdout could overtake
// text still in the pipe (a test saw that text dropped in 2 of 3 runs;
// ADR 0005, "Text before the pause").
package acptap

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"
)

// Update is the text of one agent_message_chunk or agent_thought_chunk.
type Update struct {
	SessionID string
	Text      string
	// Model is the notification's _meta["cohort.dev/model"], else the
	// update's; "" when neither says.
	Model   string
	Thought bool
}

// Tap reads one agent's stdout.
type Tap struct {
	pipe *os.File // the agent's stdout, when it is a file (FIONREAD)
	// read counts the bytes read from stdout and handled the bytes of the
	// lines handled (taken or passed on), so Settle can tell when
	// everything the agent wrote has been handled.
	read    atomic.Int64
	handled atomic.Int64
}

// MaxLine bounds one message from the agent (the SDK allows 10 MiB).
const MaxLine = 10 << 20

// Start reads stdout until it ends. update is called for each text chunk,
// in order, from the tap's goroutine; while it blocks, nothing more is
// read. The returned reader is what the SDK reads: every line the tap did
// not take, then stdout's end or error.
func Start(stdout io.Reader, update func(Update)) (*Tap, io.Reader) {
	t := &Tap{}
	t.pipe, _ = stdout.(*os.File)
	pr, pw := io.Pipe()
	go t.run(&counting{r: stdout, n: &t.read}, pw, update)
	return t, pr
}

// counting counts the bytes read through it.
type counting struct {
	r io.Reader
	n *atomic.Int64
}

func (c *counting) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (t *Tap) run(r io.Reader, w *io.PipeWriter, update func(Update)) {
	br := bufio.NewReaderSize(r, 64<<10)
	var long []byte
	for {
		frag, err := br.ReadSlice('\n')
		line := frag
		if err == bufio.ErrBufferFull || (len(long) > 0 && len(frag) > 0) {
			long = append(long, frag...)
			line = long
		}
		if err == bufio.ErrBufferFull {
			if len(long) > MaxLine {
				w.CloseWithError(fmt.Errorf("agent message larger than %d bytes", MaxLine))
				return
			}
			continue
		}
		if len(line) > 0 && !take(line, update) {
			if _, werr := w.Write(line); werr != nil {
				return
			}
		}
		t.handled.Add(int64(len(line)))
		long = long[:0]
		if err != nil {
			w.CloseWithError(err)
			return
		}
	}
}

// Settle waits (at most 250 ms) until the tap has handled every line the
// agent wrote so far: nothing unread in the pipe, nothing read but not
// handled, twice 1 ms apart. The daemon's own MCP tool calls it before
// pausing a run, so that text the agent streamed just before calling the
// tool is in the run's events before the interaction.
func (t *Tap) Settle() {
	if t == nil {
		return
	}
	quiet := func() (int64, int64, bool) {
		g, h := t.read.Load(), t.handled.Load()
		return g, h, g == h && pipeUnread(t.pipe) == 0
	}
	for deadline := time.Now().Add(250 * time.Millisecond); time.Now().Before(deadline); {
		g, h, ok := quiet()
		time.Sleep(time.Millisecond)
		if g2, h2, ok2 := quiet(); ok && ok2 && g == g2 && h == h2 {
			return
		}
	}
}

// updateMarkers identify a session/update line without decoding it. They
// cannot occur inside a JSON string, where quotes are escaped.
var updateMarkers = [][]byte{[]byte(`"method":"session/update"`), []byte(`"method": "session/update"`)}

// wireUpdate is the part of a session/update notification the daemon uses.
type wireUpdate struct {
	Params struct {
		SessionID string   `json:"sessionId"`
		Meta      wireMeta `json:"_meta"`
		Update    struct {
			SessionUpdate string `json:"sessionUpdate"`
			Content       struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
			Meta wireMeta `json:"_meta"`
		} `json:"update"`
	} `json:"params"`
}

type wireMeta struct {
	Model string `json:"cohort.dev/model"`
}

// take handles a session/update line and reports whether it did.
func take(line []byte, update func(Update)) bool {
	if u, ok := fastTake(line); ok {
		update(u)
		return true
	}
	marked := false
	for _, m := range updateMarkers {
		if bytes.Contains(line, m) {
			marked = true
			break
		}
	}
	if !marked {
		return false
	}
	var u wireUpdate
	if json.Unmarshal(line, &u) != nil {
		return false // the SDK will report it
	}
	up := u.Params.Update
	var thought bool
	switch up.SessionUpdate {
	case "agent_message_chunk":
	case "agent_thought_chunk":
		thought = true
	default:
		return true // not part of the stream
	}
	if up.Content.Type != "text" {
		return true
	}
	model := u.Params.Meta.Model
	if model == "" {
		model = up.Meta.Model
	}
	update(Update{SessionID: u.Params.SessionID, Text: up.Content.Text, Model: model, Thought: thought})
	return true
}
