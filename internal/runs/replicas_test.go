package runs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"

	cohortv1 "github.com/cohort-dev/cohort/gen/cohort/v1"
	"github.com/cohort-dev/cohort/gen/cohort/v1/cohortv1connect"
	"github.com/cohort-dev/cohort/internal/server"
	"github.com/cohort-dev/cohort/internal/store"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// ends counts the status changes told of each run, across replicas.
type ends struct {
	mu  sync.Mutex
	got map[string][]string
}

func (n *ends) RunChanged(ctx context.Context, db bun.IDB, workspaceID, eventType string, run json.RawMessage) error {
	var o struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(run, &o); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.got == nil {
		n.got = map[string][]string{}
	}
	n.got[o.ID] = append(n.got[o.ID], eventType)
	return nil
}

func (n *ends) Notify() {}

func (n *ends) of(id string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.got[id]...)
}

// replica is one more gateway on the fixture's database and daemon, its
// runs loop going, with its own log.
type replica struct {
	srv  *server.Server
	url  string
	logs *testutil.SyncBuffer
}

func (f *fixture) newReplica(t *testing.T, lease time.Duration, n *ends) *replica {
	t.Helper()
	rs := testenv.Server(t, f.e.DB, f.e.Server.KEK)
	rs.Chat.Daemons = f.prov
	logs := &testutil.SyncBuffer{}
	rs.Runs.Log = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if lease > 0 {
		rs.Runs.Config.Lease = lease
	}
	if n != nil {
		rs.Runs.Notifier = n
	}
	hs := httptest.NewServer(rs.Handler())
	t.Cleanup(hs.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rs.Runs.Run(ctx)
	return &replica{srv: rs, url: hs.URL, logs: logs}
}

// orphan makes runs look as a killed gateway leaves them: held by a
// recorder that is gone, its lease passed (until nil) or not yet. The
// fixture's gateway stops recording (its daemon streams close, as a
// killed process's do) without releasing them; it serves no events since.
func (f *fixture) orphan(t *testing.T, until *time.Time, ids ...string) {
	t.Helper()
	if _, err := f.e.DB.NewUpdate().Model((*store.Run)(nil)).Set("lease_owner = ?", "gw_killed").Set("lease_until = ?", until).
		Where("id IN (?)", bun.List(ids)).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.e.Server.Runs.Close()
}

func tookOver(logs string, id string) int {
	return strings.Count(logs, `"msg":"took over a background run","run":"`+id+`"`)
}

// checkEvents reads a run's events whole and checks them: numbered
// without gap or repeat, one role chunk, one end, with want in the text.
func checkEvents(t *testing.T, base, key, intern, id, want string) {
	t.Helper()
	evs := events(t, base, key, intern, id, "", "")
	contiguous(t, evs, 1)
	roles, finals := 0, 0
	for _, ev := range evs {
		var c struct {
			Choices []struct {
				Delta struct {
					Role *string `json:"role"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) == 0 {
			finals++
		} else if c.Choices[0].Delta.Role != nil {
			roles++
		}
	}
	if text := joinData(evs); roles != 1 || finals != 1 || !strings.Contains(text, want) {
		t.Fatalf("run %s read back: %d role chunks, %d ends, text %q", id, roles, finals, text)
	}
}

// Three replicas race for ten orphaned runs, each a command silent for
// longer than the lease: each run is taken over by exactly one of them
// once (its lease renewed from the claim, so it never passes while the
// claimer waits for the daemon), recorded whole and told ended once.
// Before, a claimer waited for the daemon's next event with its lease
// unrenewed and another replica took the same run over too.
func TestTakeoverThreeReplicas(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixture(t, db, nil)
		e := f.e
		var ids []string
		for i := range 10 {
			ids = append(ids, f.start(t, bg("$ sleep 3; echo run-"+strconv.Itoa(i)))["id"].(string))
		}
		f.orphan(t, nil, ids...)
		orphaned := time.Now()
		n := &ends{}
		var rs []*replica
		for range 3 {
			rs = append(rs, f.newReplica(t, time.Second, n))
		}
		for _, id := range ids {
			f.waitStatus(t, id, "completed")
		}
		took := time.Since(orphaned)
		for i, id := range ids {
			count := 0
			for _, r := range rs {
				count += tookOver(r.logs.String(), id)
			}
			if count != 1 {
				t.Errorf("run %d was taken over %d times", i, count)
			}
			if got := n.of(id); len(got) != 1 || got[0] != "run.completed" {
				t.Errorf("run %d was told %v", i, got)
			}
			checkEvents(t, f.replica.URL, e.WorkspaceKey, e.InternID, id, "run-"+strconv.Itoa(i))
		}
		// Each command took 3 s from its start; the takeovers ran at once.
		if took > 10*time.Second {
			t.Errorf("ten orphaned runs completed %v after they were orphaned", took)
		}
	})
}

// One replica, three orphaned runs: a long silent one (claimed first), a
// short one, and a paused one whose question expires. The short one is
// recorded completed and the question ends its run while the long one's
// daemon is still silent, and the long one stays this replica's (its
// lease renewed). Before, the takeover loop waited on the long run's
// daemon: nothing else was taken over, no question expired, and the
// claimed run's lease passed.
func TestTakeoverSilentRunHoldsNoOther(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixtureDaemon(t, db, nil, 4*time.Second)
		e := f.e
		long := f.start(t, bg("$ sleep 20; echo long"))["id"].(string)
		short := f.start(t, bg("$ sleep 1; echo short"))["id"].(string)
		paused := f.start(t, bg("still there?"))["id"].(string)
		p := f.waitStatus(t, paused, "paused")
		deadline, err := time.Parse(time.RFC3339Nano, p["pause_deadline"].(string))
		if err != nil {
			t.Fatal(err)
		}
		f.orphan(t, nil, long, short)
		orphaned := time.Now()
		r := f.newReplica(t, time.Second, nil)
		f.waitStatus(t, short, "completed")
		if took := time.Since(orphaned); took > 3*time.Second {
			t.Errorf("the short run completed %v after it was orphaned", took)
		}
		checkEvents(t, f.replica.URL, e.WorkspaceKey, e.InternID, short, "short")
		c := f.waitStatus(t, paused, "cancelled")
		if ended, _ := time.Parse(time.RFC3339Nano, c["ended_at"].(string)); ended.Sub(deadline) > time.Second {
			t.Errorf("the expired question ended its run at %v, its deadline was %v", ended, deadline)
		}
		// Three leases later the long run is still held by the one replica.
		time.Sleep(3 * time.Second)
		if got := f.get(t, long); got["status"] != "running" || tookOver(r.logs.String(), long) != 1 {
			t.Fatalf("the long run: %v; taken over %d times\n%s", got, tookOver(r.logs.String(), long), r.logs.String())
		}
		var until time.Time
		if err := db.NewSelect().Model((*store.Run)(nil)).Column("lease_until").Where("id = ?", long).Scan(context.Background(), &until); err != nil || !until.After(time.Now()) {
			t.Fatalf("the long run's lease: %v %v", until, err)
		}
	})
}

// A cancel through a replica that does not record the run, while its
// recorder is gone and its lease has not passed (a killed gateway): the
// run is cancelled in its record within a second of the cancel's answer,
// with its last chunks. Before, it showed running with cancel_requested
// until the lease passed and another replica took it over.
func TestCancelRecordedWithoutRecorder(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixture(t, db, nil)
		e := f.e
		id := f.start(t, bg("$ sleep 20; echo never"))["id"].(string)
		until := time.Now().Add(time.Minute)
		f.orphan(t, &until, id)
		r0 := f.newReplica(t, 0, nil)
		req, _ := http.NewRequest("POST", r0.url+server.Prefix+"/interns/"+e.InternID+"/runs/"+id+"/cancel", nil)
		req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if st := res.StatusCode; st != 200 {
			t.Fatalf("cancel: %d %s", st, out)
		}
		answered := time.Now()
		var r map[string]any
		testutil.Eventually(t, 5*time.Second, "the run cancelled", func() bool {
			r = f.get(t, id)
			return r["status"] != "running"
		})
		// Within a second, measured; the bound leaves a loaded machine room.
		if took := time.Since(answered); r["status"] != "cancelled" || took > 2*time.Second {
			t.Fatalf("%v after the cancel: %v", took, r)
		}
		evs := events(t, f.replica.URL, e.WorkspaceKey, e.InternID, id, "", "")
		contiguous(t, evs, 1)
		if last := evs[len(evs)-1].data; !strings.Contains(last, `"choices":[]`) {
			t.Fatalf("the cancelled run's last chunk: %s", last)
		}
	})
}

// A replica that stops gracefully hands its runs over at once: its
// readers' streams end (without [DONE]; a Connect reader gets
// Unavailable) and resume through another replica from their last event
// id, which records the run within a second, with no gap and nothing twice.
// Before, the other replica waited for the daemon's next event, and the
// readers held the stopping gateway open.
func TestGracefulStopHandsOver(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixture(t, db, nil)
		e := f.e
		// The default lease (30 s): only the hand-over is fast.
		b := f.newReplica(t, 0, nil)
		id := f.start(t, bg("$ echo before; sleep 4; echo handed-over"))["id"].(string)

		// A REST reader and a Connect reader on the stopping gateway.
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", e.HTTP.URL+server.Prefix+"/interns/"+e.InternID+"/runs/"+id+"/events", nil)
		req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("events: %v %v", res, err)
		}
		defer res.Body.Close()
		restDone := make(chan []string, 1)
		go func() {
			var lines []string
			sc := bufio.NewScanner(res.Body)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			restDone <- lines
		}()
		rc := cohortv1connect.NewRunServiceClient(e.HTTPClient(), e.HTTP.URL+server.Prefix)
		creq := connect.NewRequest(&cohortv1.StreamRunEventsRequest{InternId: e.InternID, RunId: id})
		creq.Header().Set("Authorization", "Bearer "+e.WorkspaceKey)
		cs, err := rc.StreamRunEvents(ctx, creq)
		if err != nil {
			t.Fatal(err)
		}
		connectDone := make(chan error, 1)
		go func() {
			for cs.Receive() {
			}
			connectDone <- cs.Err()
		}()
		time.Sleep(300 * time.Millisecond) // both readers attached
		stopped := time.Now()
		e.Server.Drain()
		var lines []string
		select {
		case lines = <-restDone:
		case <-time.After(2 * time.Second):
			t.Fatal("the REST reader's stream still open 2 s after the stop")
		}
		select {
		case err := <-connectDone:
			if connect.CodeOf(err) != connect.CodeUnavailable {
				t.Fatalf("the Connect reader's end: %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("the Connect reader's stream still open 2 s after the stop")
		}
		lastID := ""
		for _, l := range lines {
			if l == "data: [DONE]" {
				t.Fatal("the stopping gateway said the run ended")
			}
			if v, ok := strings.CutPrefix(l, "id: "); ok {
				lastID = v
			}
		}
		if lastID == "" {
			t.Fatalf("no event before the stop: %q", lines)
		}
		testutil.Eventually(t, 5*time.Second, "the other replica takes the run over", func() bool {
			return tookOver(b.logs.String(), id) == 1
		})
		if took := time.Since(stopped); took > 2*time.Second {
			t.Errorf("taken over %v after the stop", took)
		}
		// The reader resumes through the other replica.
		rest := events(t, b.url, e.WorkspaceKey, e.InternID, id, "", lastID)
		from, _ := strconv.ParseInt(lastID, 10, 64)
		contiguous(t, rest, from+1)
		if !strings.Contains(joinData(rest), "handed-over") {
			t.Fatalf("resumed events: %v", rest)
		}
		checkEvents(t, b.url, e.WorkspaceKey, e.InternID, id, "handed-over")
		// A stopped gateway starts no run: another replica should.
		st, out, _ := e.Do(t, "POST", "/interns/"+e.InternID+"/chat/completions", e.WorkspaceKey, "application/json", bg("hi"))
		if st != 503 || !strings.Contains(out, "temporarily_unavailable") {
			t.Fatalf("a run started on a stopped gateway: %d %s", st, out)
		}
	})
}

// On PostgreSQL a gateway holds a lock for as long as it lives: a run
// whose recorder died is taken over at once, its lease not passed, while
// a live recorder's runs are left to it. Before, a killed gateway's runs
// waited for their lease (30 s by default).
func TestKilledRecorderTakenOverBeforeLease(t *testing.T) {
	db := storetest.Postgres(t)
	f := newFixture(t, db, nil)
	e := f.e
	r := f.newReplica(t, time.Minute, nil)
	// A live recorder's run: not taken.
	live := f.start(t, bg("$ sleep 2; echo live"))["id"].(string)
	// A dead recorder's run, its lease a minute off.
	dead := f.start(t, bg("$ sleep 2; echo dead"))["id"].(string)
	until := time.Now().Add(time.Minute)
	if _, err := db.NewUpdate().Model((*store.Run)(nil)).Set("lease_owner = ?", "gw_killed").Set("lease_until = ?", until).
		Where("id = ?", dead).Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	orphaned := time.Now()
	f.waitStatus(t, dead, "completed")
	if took := time.Since(orphaned); took > 10*time.Second || tookOver(r.logs.String(), dead) != 1 {
		t.Fatalf("the dead recorder's run completed %v after; taken over %d times", took, tookOver(r.logs.String(), dead))
	}
	checkEvents(t, f.replica.URL, e.WorkspaceKey, e.InternID, dead, "dead")
	f.waitStatus(t, live, "completed")
	if n := tookOver(r.logs.String(), live); n != 0 {
		t.Fatalf("a live recorder's run was taken over %d times", n)
	}
}

// A cancel through a replica while another, live, records the run: the
// recording moves to the replica asked, the live recorder lets go at its
// next write, and the run's chunks and its end are recorded once.
func TestCancelMovesRecordingFromLiveRecorder(t *testing.T) {
	storetest.Each(t, func(t *testing.T, db *bun.DB) {
		f := newFixture(t, db, nil)
		e := f.e
		n := &ends{}
		e.Server.Runs.Notifier = n
		r0 := f.newReplica(t, 0, n)
		id := f.start(t, bg("$ sleep 20; echo never"))["id"].(string)
		req, _ := http.NewRequest("POST", r0.url+server.Prefix+"/interns/"+e.InternID+"/runs/"+id+"/cancel", nil)
		req.Header.Set("Authorization", "Bearer "+e.WorkspaceKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("cancel: %d", res.StatusCode)
		}
		f.waitStatus(t, id, "cancelled")
		evs := events(t, f.replica.URL, e.WorkspaceKey, e.InternID, id, "", "")
		contiguous(t, evs, 1)
		finals := 0
		for _, ev := range evs {
			if strings.Contains(ev.data, `"choices":[]`) {
				finals++
			}
		}
		if finals != 1 {
			t.Fatalf("%d ends in %d events", finals, len(evs))
		}
		if got := n.of(id); len(got) != 1 || got[0] != "run.cancelled" {
			t.Fatalf("told %v", got)
		}
	})
}
