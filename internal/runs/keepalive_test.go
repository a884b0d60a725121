package runs_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/runs"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

// received is a message or a line of a stream, with when it came.
type received[T any] struct {
	at time.Time
	v  T
}

// next is the next item of ch, false when ch has closed; past deadline
// the test fails with what.
func next[T any](t *testing.T, ch <-chan received[T], deadline time.Time, what string) (received[T], bool) {
	t.Helper()
	select {
	case r, ok := <-ch:
		return r, ok
	case <-time.After(time.Until(deadline)):
		t.Fatalf("timed out waiting for %s", what)
		return received[T]{}, false
	}
}

// keepalivesWhilePaused checks the keepalives' times between the pause's
// chunk and the next one: at least three, none sooner than half the
// interval after the one before, their median gap near the interval
// (not the 30 s default).
func keepalivesWhilePaused(t *testing.T, door string, times []time.Time, every time.Duration) {
	t.Helper()
	if len(times) < 3 {
		t.Fatalf("%s: %d keepalives while paused, want 3 or more", door, len(times))
	}
	var gaps []time.Duration
	for i := 1; i < len(times); i++ {
		g := times[i].Sub(times[i-1])
		if g < every/2 {
			t.Fatalf("%s: keepalive %d came %v after the one before (interval %v)", door, i, g, every)
		}
		gaps = append(gaps, g)
	}
	for i := 1; i < len(gaps); i++ { // insertion sort: a handful of gaps
		for j := i; j > 0 && gaps[j] < gaps[j-1]; j-- {
			gaps[j], gaps[j-1] = gaps[j-1], gaps[j]
		}
	}
	if med := gaps[len(gaps)/2]; med > 4*every {
		t.Fatalf("%s: median keepalive gap %v, interval %v", door, med, every)
	}
}

func isPause(c *cohortv1.ChatCompletionChunk) bool {
	ch := c.GetChoices()
	return len(ch) > 0 && ch[0].GetFinishReason() == "tool_calls"
}

// A paused run's event streams are not silent: after Config.Keepalive of
// silence the Connect stream sends a keepalive message (keepalive, seq 0,
// no chunk) and the REST stream a `: keepalive` comment, again and again
// while the pause lasts; once it is answered the rest of the chunks follow
// with the next sequence numbers and both streams end.
func TestRunEventsKeepalive(t *testing.T) {
	const every = 150 * time.Millisecond
	// Far below the 30 s default: without the setting no keepalive comes
	// in time.
	const within = 10 * time.Second
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixture(t, db, func(c *runs.Config) { c.Keepalive = every })
		e := f.e
		r := f.start(t, bg("shall we?"))
		id, session := r["id"].(string), r["session_id"].(string)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()

		// Both doors' streams, read as they come.
		c := cohortv1connect.NewRunServiceClient(e.HTTPClient(), e.URL)
		s, err := c.StreamRunEvents(ctx, authed(&cohortv1.StreamRunEventsRequest{InternId: e.InternID, RunId: id}, e.WorkspaceKey))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		cmsgs := make(chan received[*cohortv1.StreamRunEventsResponse], 4096)
		cerr := make(chan error, 1)
		go func() {
			defer close(cmsgs)
			for s.Receive() {
				cmsgs <- received[*cohortv1.StreamRunEventsResponse]{time.Now(), s.Msg()}
			}
			cerr <- s.Err()
		}()
		req, _ := http.NewRequestWithContext(ctx, "GET", e.HTTP.URL+server.Prefix+"/interns/"+e.InternID+"/runs/"+id+"/events", nil)
		req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("events: %d", res.StatusCode)
		}
		rlines := make(chan received[string], 4096)
		go func() {
			defer close(rlines)
			sc := bufio.NewScanner(res.Body)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				rlines <- received[string]{time.Now(), sc.Text()}
			}
		}()

		// Connect: up to the pause's chunk, then three keepalives.
		var cAll []*cohortv1.StreamRunEventsResponse
		var cKeep []time.Time
		paused := false
		deadline := time.Now().Add(wait)
		for len(cKeep) < 3 {
			m, ok := next(t, cmsgs, deadline, "the Connect stream's pause and keepalives")
			if !ok {
				t.Fatalf("the Connect stream ended while paused (%v) after %d messages", <-cerr, len(cAll))
			}
			cAll = append(cAll, m.v)
			switch {
			case m.v.GetKeepalive() && paused:
				cKeep = append(cKeep, m.at)
			case !m.v.GetKeepalive() && isPause(m.v.GetChunk()):
				paused, deadline = true, time.Now().Add(within)
			}
		}
		// REST: the same.
		var rKeep []time.Time
		var rLines []string
		paused = false
		deadline = time.Now().Add(wait)
		for len(rKeep) < 3 {
			l, ok := next(t, rlines, deadline, "the REST stream's pause and keepalives")
			if !ok {
				t.Fatalf("the REST stream ended while paused: %q", rLines)
			}
			rLines = append(rLines, l.v)
			switch {
			case l.v == ": keepalive" && paused:
				rKeep = append(rKeep, l.at)
			case strings.HasPrefix(l.v, "data: ") && strings.Contains(l.v, `"finish_reason":"tool_calls"`):
				paused, deadline = true, time.Now().Add(within)
			}
		}
		// Still paused: nobody answered yet.
		p := f.waitStatus(t, id, "paused")
		ia := p["pending_interaction"].(map[string]any)
		if st, out, _ := f.do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey,
			answer(session, ia["id"].(string), `{"action":"accept","content":{"answer":"yes"}}`)); st != http.StatusAccepted {
			t.Fatalf("answer: %d %s", st, out)
		}

		// Both streams to their ends; the keepalives of the pause are
		// those before the answer's first chunk.
		deadline = time.Now().Add(wait)
		answered := false
		for {
			m, ok := next(t, cmsgs, deadline, "the end of the Connect stream")
			if !ok {
				break
			}
			cAll = append(cAll, m.v)
			if m.v.GetKeepalive() {
				if !answered {
					cKeep = append(cKeep, m.at)
				}
			} else {
				answered = true
			}
		}
		if err := <-cerr; err != nil {
			t.Fatalf("the Connect stream ended with %v", err)
		}
		answered = false
		for {
			l, ok := next(t, rlines, deadline, "the end of the REST stream")
			if !ok {
				break
			}
			rLines = append(rLines, l.v)
			switch {
			case l.v == ": keepalive":
				if !answered {
					rKeep = append(rKeep, l.at)
				}
			case strings.HasPrefix(l.v, "data: "):
				answered = true
			}
		}
		keepalivesWhilePaused(t, "Connect", cKeep, every)
		keepalivesWhilePaused(t, "REST", rKeep, every)

		// REST: every chunk with the next id, then [DONE].
		for len(rLines) > 0 && rLines[len(rLines)-1] == "" {
			rLines = rLines[:len(rLines)-1]
		}
		if len(rLines) == 0 || rLines[len(rLines)-1] != "data: [DONE]" {
			t.Fatalf("the REST stream did not end with [DONE]: %q", rLines)
		}
		var evs []event
		var cur int64
		for _, l := range rLines[:len(rLines)-1] {
			switch {
			case strings.HasPrefix(l, "id: "):
				if cur, err = strconv.ParseInt(l[4:], 10, 64); err != nil {
					t.Fatalf("id line %q", l)
				}
			case strings.HasPrefix(l, "data: "):
				evs = append(evs, event{cur, l[6:]})
			case l != "" && l != ": keepalive":
				t.Fatalf("REST line %q", l)
			}
		}
		contiguous(t, evs, 1)
		// Connect: keepalives carry nothing; the chunks are REST's, to
		// the byte, with the same sequence numbers.
		var chunks []*cohortv1.StreamRunEventsResponse
		for _, m := range cAll {
			if m.GetKeepalive() {
				if m.GetSeq() != 0 || m.GetChunk() != nil {
					t.Fatalf("a keepalive with seq %d, chunk %v", m.GetSeq(), m.GetChunk())
				}
				continue
			}
			chunks = append(chunks, m)
		}
		if len(chunks) != len(evs) {
			t.Fatalf("%d Connect chunks, REST %d", len(chunks), len(evs))
		}
		for i, m := range chunks {
			if m.GetSeq() != int64(i+1) || m.GetSeq() != evs[i].id || string(sse.AppendChunk(nil, m.GetChunk())) != evs[i].data {
				t.Fatalf("chunk %d: seq %d %s\nREST: id %d %s", i, m.GetSeq(), sse.AppendChunk(nil, m.GetChunk()), evs[i].id, evs[i].data)
			}
		}
		done := f.waitStatus(t, id, "completed")
		if int64(done["last_event_id"].(float64)) != int64(len(evs)) || !strings.Contains(joinData(evs), "yes") {
			t.Fatalf("completed run %v after %d chunks", done, len(evs))
		}
	})
}
