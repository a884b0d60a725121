package runs_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/auth"
	"github.com/cohort-dev/cohort/internal/sse"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
)

func authed[T any](msg *T, key string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	if key != "" {
		req.Header().Set("Authorization", "Bearer "+key)
	}
	return req
}

// reason is the spec's reason a Connect error carries (its ErrorDetail).
func reason(err error) string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return ""
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if det, ok := v.(*cohortv1.ErrorDetail); ok {
				return det.GetReason()
			}
		}
	}
	return ""
}

// streamRun reads StreamRunEvents after after until it ends, or until
// stop says so of a message (then the reader leaves).
func streamRun(t *testing.T, c cohortv1connect.RunServiceClient, key, intern, id string, after int64, stop func(*cohortv1.StreamRunEventsResponse) bool) ([]*cohortv1.StreamRunEventsResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	s, err := c.StreamRunEvents(ctx, authed(&cohortv1.StreamRunEventsRequest{InternId: intern, RunId: id, After: after}, key))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var out []*cohortv1.StreamRunEventsResponse
	for s.Receive() {
		out = append(out, s.Msg())
		if stop != nil && stop(s.Msg()) {
			return out, nil
		}
	}
	return out, s.Err()
}

// RunService is the REST run routes' twin: the same run, the same chunks
// (each reads back to the exact bytes of the REST stream, with the same
// sequence numbers), the same scoping and the same refusals.
func TestRunServiceConnect(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixture(t, db, nil)
		e := f.e
		ctx := context.Background()
		c := cohortv1connect.NewRunServiceClient(e.HTTPClient(), e.URL)
		id := f.start(t, bg("hello there"))["id"].(string)
		done := f.waitStatus(t, id, "completed")

		got, err := c.GetRun(ctx, authed(&cohortv1.GetRunRequest{InternId: e.InternID, RunId: id}, e.WorkspaceKey))
		if err != nil {
			t.Fatal(err)
		}
		r := got.Msg.GetRun()
		if r.GetId() != id || r.GetStatus() != "completed" || r.GetSessionId() != done["session_id"] || r.GetUsage() == nil ||
			r.GetUsage().GetTotalTokens() != int64(done["usage"].(map[string]any)["total_tokens"].(float64)) ||
			r.EndedAt == nil || r.GetEndedAt() != done["ended_at"] || r.GetCreatedAt() != done["created_at"] ||
			r.GetLastEventId() != int64(done["last_event_id"].(float64)) || r.GetError() != nil || r.GetPendingInteraction() != nil {
			t.Fatalf("GetRun %v, REST %v", r, done)
		}

		// The stream from the start: the REST stream's chunks, to the byte.
		evs := events(t, e.HTTP.URL, e.WorkspaceKey, e.InternID, id, "", "")
		msgs, err := streamRun(t, c, e.WorkspaceKey, e.InternID, id, 0, nil)
		if err != nil || len(msgs) != len(evs) || int64(len(msgs)) != r.GetLastEventId() {
			t.Fatalf("StreamRunEvents: %d messages (%v), REST %d", len(msgs), err, len(evs))
		}
		for i, m := range msgs {
			if m.GetSeq() != evs[i].id || string(sse.AppendChunk(nil, m.GetChunk())) != evs[i].data {
				t.Fatalf("message %d: seq %d %s\nREST: id %d %s", i, m.GetSeq(), sse.AppendChunk(nil, m.GetChunk()), evs[i].id, evs[i].data)
			}
		}
		// After a sequence number: the rest, then nothing after the last.
		msgs, err = streamRun(t, c, e.WorkspaceKey, e.InternID, id, 2, nil)
		if err != nil || len(msgs) != len(evs)-2 || msgs[0].GetSeq() != 3 {
			t.Fatalf("after 2: %d messages (%v)", len(msgs), err)
		}
		if msgs, err = streamRun(t, c, e.WorkspaceKey, e.InternID, id, int64(len(evs)), nil); err != nil || len(msgs) != 0 {
			t.Fatalf("after the last: %v %v", msgs, err)
		}
		if _, err = streamRun(t, c, e.WorkspaceKey, e.InternID, id, -1, nil); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("after -1: %v", err)
		}

		list, err := c.ListSessionRuns(ctx, authed(&cohortv1.ListSessionRunsRequest{InternId: e.InternID, SessionId: r.GetSessionId()}, e.WorkspaceKey))
		if err != nil || len(list.Msg.GetRuns()) != 1 || list.Msg.GetRuns()[0].GetId() != id {
			t.Fatalf("ListSessionRuns: %v %v", list, err)
		}

		// An ended run cannot be cancelled: REST's 409 run_ended is
		// FailedPrecondition with the same reason.
		_, err = c.CancelRun(ctx, authed(&cohortv1.CancelRunRequest{InternId: e.InternID, RunId: id}, e.WorkspaceKey))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || reason(err) != "run_ended" {
			t.Fatalf("cancel an ended run: %v", err)
		}
		if st, out, _ := f.do(t, "POST", "/interns/"+e.InternID+"/runs/"+id+"/cancel", e.WorkspaceKey, ""); st != http.StatusConflict || !strings.Contains(out, "run_ended") {
			t.Fatalf("REST cancel of an ended run: %d %s", st, out)
		}

		// Another workspace's key, an unknown run, an unknown intern: NotFound
		// on every procedure, as REST's 404.
		ws, err := e.Server.Workspaces.Create(ctx, auth.Operator(e.OrganizationID), &cohortv1.CreateWorkspaceRequest{Name: ptr("other")})
		if err != nil {
			t.Fatal(err)
		}
		other := e.NewKey(t, store.KeyWorkspace, ws.GetId())
		for _, k := range []struct{ key, intern, run string }{{other, e.InternID, id}, {e.WorkspaceKey, e.InternID, "run_nope"}, {e.WorkspaceKey, "nope", id}} {
			_, err := c.GetRun(ctx, authed(&cohortv1.GetRunRequest{InternId: k.intern, RunId: k.run}, k.key))
			_, err2 := c.CancelRun(ctx, authed(&cohortv1.CancelRunRequest{InternId: k.intern, RunId: k.run}, k.key))
			_, err3 := streamRun(t, c, k.key, k.intern, k.run, 0, nil)
			for _, err := range []error{err, err2, err3} {
				if connect.CodeOf(err) != connect.CodeNotFound {
					t.Fatalf("%s/%s with key %q: %v", k.intern, k.run, k.key[:8], err)
				}
			}
		}
		if _, err := c.ListSessionRuns(ctx, authed(&cohortv1.ListSessionRunsRequest{InternId: e.InternID, SessionId: r.GetSessionId()}, other)); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("list from another workspace: %v", err)
		}
		if _, err := c.GetRun(ctx, authed(&cohortv1.GetRunRequest{InternId: e.InternID, RunId: id}, "")); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("no key: %v", err)
		}

		// A live run: read until it pauses and leave; answer it; resume
		// from the last sequence number read: no gap, no repeat, and the
		// whole is the REST stream.
		id = f.start(t, bg("shall we?"))["id"].(string)
		first, err := streamRun(t, c, e.WorkspaceKey, e.InternID, id, 0, func(m *cohortv1.StreamRunEventsResponse) bool {
			ch := m.GetChunk().GetChoices()
			return len(ch) > 0 && ch[0].GetFinishReason() == "tool_calls"
		})
		if err != nil || len(first) == 0 {
			t.Fatalf("the paused run's stream: %v %v", first, err)
		}
		// The pause's chunks commit with its status: it is paused now.
		p, err := c.GetRun(ctx, authed(&cohortv1.GetRunRequest{InternId: e.InternID, RunId: id}, e.WorkspaceKey))
		if err != nil || p.Msg.GetRun().GetStatus() != "paused" {
			t.Fatalf("after the pause's chunk: %v %v", p, err)
		}
		ia := p.Msg.GetRun().GetPendingInteraction()
		if ia.GetId() == "" || ia.GetFunction().GetName() != "service.provide_input" || p.Msg.GetRun().PauseDeadline == nil {
			t.Fatalf("paused run: %v", p.Msg.GetRun())
		}
		if st, out, _ := f.do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey,
			answer(p.Msg.GetRun().GetSessionId(), ia.GetId(), `{"action":"accept","content":{"answer":"yes"}}`)); st != http.StatusAccepted {
			t.Fatalf("answer: %d %s", st, out)
		}
		last := first[len(first)-1].GetSeq()
		rest, err := streamRun(t, c, e.WorkspaceKey, e.InternID, id, last, nil)
		if err != nil || len(rest) == 0 {
			t.Fatalf("resume after %d: %v %v", last, rest, err)
		}
		all := append(first, rest...)
		evs = events(t, e.HTTP.URL, e.WorkspaceKey, e.InternID, id, "", "")
		if len(all) != len(evs) {
			t.Fatalf("%d messages across the resume, REST %d", len(all), len(evs))
		}
		for i, m := range all {
			if m.GetSeq() != int64(i+1) || string(sse.AppendChunk(nil, m.GetChunk())) != evs[i].data {
				t.Fatalf("message %d across the resume: seq %d %s\nREST %s", i, m.GetSeq(), sse.AppendChunk(nil, m.GetChunk()), evs[i].data)
			}
		}
		f.waitStatus(t, id, "completed")

		// CancelRun of a paused run: cancelled at once, with REST's error
		// object; its stream then ends.
		id = f.start(t, bg("again?"))["id"].(string)
		f.waitStatus(t, id, "paused")
		cr, err := c.CancelRun(ctx, authed(&cohortv1.CancelRunRequest{InternId: e.InternID, RunId: id}, e.WorkspaceKey))
		if err != nil {
			t.Fatal(err)
		}
		if r := cr.Msg.GetRun(); r.GetStatus() != "cancelled" || r.GetError().GetCode() != 410 || r.GetError().GetReason() != "run_ended" ||
			r.EndedAt == nil || r.GetPendingInteraction() != nil {
			t.Fatalf("CancelRun: %v", r)
		}
		if msgs, err := streamRun(t, c, e.WorkspaceKey, e.InternID, id, 0, nil); err != nil || len(msgs) == 0 {
			t.Fatalf("a cancelled run's stream: %v %v", msgs, err)
		}
	})
}
